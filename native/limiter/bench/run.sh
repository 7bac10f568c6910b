#!/usr/bin/env bash
# The limiter's micro-benchmark (make bench): call overheads, then compute-cap accuracy at 10/30/50/70 %
# (and 30 % shared by two processes) on the fake driver's simulated GPU. Figures only; nothing asserted
# beyond the programs' own sanity checks.
#
#   bench/run.sh <build dir>
set -eu
B=$(cd "$1" && pwd)
for v in $(env | sed -n 's/^\(DRAGPU_[A-Za-z0-9_]*\)=.*/\1/p; s/^\(FAKE_CUDA_[A-Za-z0-9_]*\)=.*/\1/p'); do unset "$v"; done
export LD_LIBRARY_PATH="$B/fake"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
claim() { mktemp -d "$tmp/claim.XXXX"; }

echo "== overhead per call (fake driver, limiter preloaded)"
FAKE_CUDA_WAVE_NS=0 LD_PRELOAD="$B/libdragpu-limiter.so.1" DRAGPU_MEMORY_LIMIT=64Gi \
    DRAGPU_LIMITER_STATE_DIR="$(claim)" "$B/bench/limiter-bench"
FAKE_CUDA_WAVE_NS=0 LD_PRELOAD="$B/libdragpu-limiter.so.1" DRAGPU_CORES_LIMIT=99 \
    DRAGPU_LIMITER_STATE_DIR="$(claim)" "$B/bench/limiter-bench" 2000000 throttled
# The same with the real H100's host costs (a launch 4.1 us, an event record 1.2 us, a query 0.28 us): what the
# limiter's timing events cost a throttled launch on a real driver.
FAKE_CUDA_REAL_TIMING=1 FAKE_CUDA_WAVE_NS=0 LD_PRELOAD="$B/libdragpu-limiter.so.1" DRAGPU_CORES_LIMIT=99 \
    DRAGPU_LIMITER_STATE_DIR="$(claim)" "$B/bench/limiter-bench" 210000 throttled
# ... and for one kernel and grid whose times spread (1 and 3 us in turn), which the limiter times on every launch.
FAKE_CUDA_REAL_TIMING=1 FAKE_CUDA_WAVE_NS=0 LD_PRELOAD="$B/libdragpu-limiter.so.1" DRAGPU_CORES_LIMIT=99 \
    DRAGPU_LIMITER_STATE_DIR="$(claim)" "$B/bench/limiter-bench" 210000 throttled spread

echo "== compute cap: busy fraction of the simulated GPU vs DRAGPU_CORES_LIMIT (3 s windows; kernels of"
echo "   10 us - 1 ms, every launch family, graphs, and every 16th launch a capture launched as a graph)"
export FAKE_CUDA_SM_COUNT=132 FAKE_CUDA_WAVE_NS=10000
for c in 10 30 50 70; do
    LD_PRELOAD="$B/libdragpu-limiter.so.1" DRAGPU_CORES_LIMIT=$c DRAGPU_LIMITER_STATE_DIR="$(claim)" \
        "$B/tests/t_compute" $c 3 || true
done
echo "   ... with a global-mode capture open for the whole run, and shared by two processes:"
LD_PRELOAD="$B/libdragpu-limiter.so.1" DRAGPU_CORES_LIMIT=30 T_COMPUTE_OPEN_CAPTURE=1 \
    DRAGPU_LIMITER_STATE_DIR="$(claim)" "$B/tests/t_compute" 30 3 || true
LD_PRELOAD="$B/libdragpu-limiter.so.1" DRAGPU_CORES_LIMIT=30 DRAGPU_LIMITER_STATE_DIR="$(claim)" \
    "$B/tests/t_compute" 30 3 2 || true
