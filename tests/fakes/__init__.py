"""Stand-ins for things that cannot run on a CPU-only test machine, keeping the real things' semantics."""
