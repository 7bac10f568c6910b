"""The sharing modes, one module (or package) each: `exclusive`, `timeslicing`, `limiter` (with the claim's
accounting region, `limiter_region`, and the GPU's arbitration board, `arbitration`) and `mps` (MPS
protocol 2 daemons and protocol 3 namespaces). What every claim goes through whatever its mode is in
`..steps`; `..__init__` lists both once."""
