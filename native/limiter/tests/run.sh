#!/usr/bin/env bash
# Runs the limiter's test suite against the fake driver and NVML; prints PASS/FAIL per test and exits
# non-zero if any failed. Called by `make test` (once per build: plain, then sanitized).
#
#   tests/run.sh <build dir>
#
# LIMITER_SANITIZER_LIB: the sanitizer runtime (libasan.so, libtsan.so), preloaded first in sanitizer builds.
# LIMITER_CUDA_INCLUDE: the CUDA toolkit's include directory, if any (src/cuda_min.h is checked against it).
set -u
here=$(cd "$(dirname "$0")" && pwd)
B=$(cd "$1" && pwd)
LIB=$B/libdragpu-limiter.so.1
PRELOAD="${LIMITER_SANITIZER_LIB:+$LIMITER_SANITIZER_LIB }$LIB"

# A clean, known environment: no limiter settings from the caller, the fakes on the library path.
for v in $(env | sed -n 's/^\(DRAGPU_[A-Za-z0-9_]*\)=.*/\1/p; s/^\(FAKE_CUDA_[A-Za-z0-9_]*\)=.*/\1/p'); do unset "$v"; done
export LD_LIBRARY_PATH="$B/fake"
export FAKE_CUDA_SM_COUNT=132 FAKE_CUDA_WAVE_NS=10000
# The fake's contexts take what a real one does (549 MB, tests/real-gpu/h100-driver-facts.txt); the tests
# of other things run with contexts that hold only their limits' memory, those of contexts set their size.
export FAKE_CUDA_CTX_BYTES=0
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:report_signal_unsafe=0

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
passed=0
failed=0

# run <name> <command and arguments...>: the command's last output line is shown on success. The output goes
# to a file of its own, not a pipe: a process that a failing case leaves behind cannot hold the suite up.
run() {
    local name=$1 out file status=0
    shift
    file=$(mktemp "$TMP/out.XXXX")
    "$@" >"$file" 2>&1 || status=$?
    out=$(cat "$file")
    if [ "$status" -eq 0 ]; then
        passed=$((passed + 1))
        printf 'PASS %-28s  %s\n' "$name" "$(printf '%s\n' "$out" | tail -n 1)"
    else
        failed=$((failed + 1))
        printf 'FAIL %s\n' "$name"
        printf '%s\n' "$out" | tail -n 40 | sed 's/^/    /'
    fi
}

# limited VAR=VALUE... -- <command>: runs the command with the limiter preloaded and a fresh state dir.
limited() {
    local dir
    dir=$(mktemp -d "$TMP/claim.XXXX")
    env LD_PRELOAD="$PRELOAD" DRAGPU_LIMITER_STATE_DIR="$dir" "$@"
}

run exports "$here/check_exports.sh" "$B"
# Every entry point that can bring device memory into being is wrapped, or classified with the reason it need not be.
run "entry points" "${PYTHON:-python3}" "$here/check_entry_points.py" "$here/../libdragpu-limiter.map" \
    ${LIMITER_CUDA_INCLUDE:+"$LIMITER_CUDA_INCLUDE"}
# Our CUDA declarations against the toolkit's, where it is installed (the build never needs it).
if [ -f "${LIMITER_CUDA_INCLUDE:-}/cuda.h" ]; then
    run "cuda_min.h = toolkit" "${PYTHON:-python3}" "$here/check_cuda_min.py" "$here/../src/cuda_min.h" \
        "$LIMITER_CUDA_INCLUDE" "${CC:-cc}"
fi
run env-parsing+fuzz "$B/tests/t_env_fuzz" 200000
# Every launch entry point the header declares (the toolkit's where installed, else cuda_min.h), on every route.
toolkit=""
[ -f "${LIMITER_CUDA_INCLUDE:-}/cudaTypedefs.h" ] && toolkit=$LIMITER_CUDA_INCLUDE
run "launch entry points" "${PYTHON:-python3}" "$here/check_launch_entrypoints.py" "$here/../src/cuda_min.h" "$toolkit" \
    "$B/tests/t_entrypoints" "$PRELOAD"

for t in t_linked t_dlsym t_getproc; do
    run "$t (baseline)" env DRAGPU_MEMORY_LIMIT=1Gi "$B/tests/$t" baseline
    run "$t" limited DRAGPU_MEMORY_LIMIT=1Gi "$B/tests/$t" limited
done

run "t_nvml (baseline)" "$B/tests/t_nvml" baseline
run "t_nvml global limit" limited DRAGPU_MEMORY_LIMIT=1Gi "$B/tests/t_nvml" limited 1073741824
# By UUID and by ordinal, as the kubelet plugin writes them: the UUID's wins.
run "t_nvml limit by UUID" limited DRAGPU_MEMORY_LIMIT=1Gi DRAGPU_MEMORY_LIMIT_0=768Mi \
    DRAGPU_MEMORY_LIMIT_BY_UUID=GPU-4a5c1e2d-7b3f-4e11-9a60-000000000000=512Mi "$B/tests/t_nvml" limited 536870912
# By ordinal only: NVML cannot tell the ordinal before the program initialises CUDA (the global limit then).
run "t_nvml limit by ordinal" limited DRAGPU_MEMORY_LIMIT=1Gi DRAGPU_MEMORY_LIMIT_0=768Mi \
    "$B/tests/t_nvml" limited 805306368 1073741824

run "t_ctx (baseline)" env DRAGPU_CORES_LIMIT=50 "$B/tests/t_ctx" baseline
run t_ctx limited DRAGPU_CORES_LIMIT=50 "$B/tests/t_ctx" limited

# Every way device memory comes to exist, on two GPUs: accounted = what the driver holds, refusals.
for sc in stream-device pool-kept graph graph-legacy serving capture legacy-abi granularity import ipc ipc-same-claim import-same-claim export-churn \
        import-self import-self-no-kcmp; do
    run "t_paths $sc" limited FAKE_CUDA_DEVICE_COUNT=2 DRAGPU_MEMORY_LIMIT=1Gi "$B/tests/t_paths" "$sc"
done
run "t_paths contexts" limited FAKE_CUDA_DEVICE_COUNT=2 DRAGPU_MEMORY_LIMIT=1Gi FAKE_CUDA_CTX_STACK_BYTES=1024 \
    FAKE_CUDA_CTX_HEAP_BYTES=8388608 FAKE_CUDA_CTX_FIFO_BYTES=1048576 FAKE_CUDA_CTX_BYTES=4194304 "$B/tests/t_paths" contexts
# ... with a tenant's NVML first on the library path (it says the GPU is all free): contexts are measured with the
# driver's own NVML, beside libcuda, never with it.
run "t_paths contexts (tenant NVML)" limited LD_LIBRARY_PATH="$B/tests/tenant:$B/fake" FAKE_CUDA_DEVICE_COUNT=2 \
    DRAGPU_MEMORY_LIMIT=1Gi FAKE_CUDA_CTX_STACK_BYTES=1024 FAKE_CUDA_CTX_HEAP_BYTES=8388608 FAKE_CUDA_CTX_FIFO_BYTES=1048576 \
    FAKE_CUDA_CTX_BYTES=4194304 "$B/tests/t_paths" contexts

run t_multiproc limited DRAGPU_MEMORY_LIMIT=1Gi "$B/tests/t_multiproc" "$B"
# Contexts of the real driver's size (the fake's default), under the cap of the first H100 run.
run "t_multiproc contexts" limited DRAGPU_MEMORY_LIMIT=3000Mi FAKE_CUDA_CTX_BYTES= "$B/tests/t_multiproc" "$B" contexts 3000
run t_fork limited DRAGPU_MEMORY_LIMIT=1Gi "$B/tests/t_fork"
run t_threads limited DRAGPU_MEMORY_LIMIT=64Mi DRAGPU_CORES_LIMIT=50 "$B/tests/t_threads"
run t_failopen "$here/t_failopen.sh" "$B" "$PRELOAD"
for c in lowered impossible deleted replaced resized header shared clock unlocked; do
    run "t_region $c" limited DRAGPU_MEMORY_LIMIT=1Gi DRAGPU_CORES_LIMIT=50 sh -c '"$1" "$2" 2>"$3"; r=$?; [ $r -ne 0 ] && cat "$3";
        [ $r -eq 0 ] && { { [ "$2" = lowered ] || [ "$2" = unlocked ]; } || [ "$(grep -c "dragpu-limiter: error: the " "$3")" -eq 1 ] ||
        { echo "expected one error line:"; cat "$3"; exit 1; }; }; exit $r' sh "$B/tests/t_region" "$c" "$TMP/region-$c.err"
done
run t_limits "$here/t_limits.sh" "$B" "${LIMITER_SANITIZER_LIB:-}" "$LIMITER_CLAIMS_ROOT"
# Elastic compute: several claims on one GPU with the agent's board and activity files.
run t_elastic "$here/t_elastic.sh" "$B" "${LIMITER_SANITIZER_LIB:-}" "$LIMITER_CLAIMS_ROOT" "${LIMITER_GPUS_ROOT:-$B/gpus}"

if [ -x "$B/tests/t_cudart" ]; then
    run t_cudart limited FAKE_CUDA_GETPROC_LOG="$TMP/lookups.log" DRAGPU_LOG_LEVEL=debug \
        sh -c '"$1" "$2" "$3" 2>"$3"' sh "$B/tests/t_cudart" "$TMP/lookups.log" "$TMP/limiter.log"
fi

# Stream capture survives the limiter, in every capture mode, and the graph's memory is charged.
for sc in global thread-local relaxed other-thread; do
    run "t_capture $sc (baseline)" "$B/tests/t_capture" "$sc"
    run "t_capture $sc" limited DRAGPU_MEMORY_LIMIT=1Gi DRAGPU_CORES_LIMIT=30 "$B/tests/t_capture" "$sc"
done
# The fake's capture rules are the real driver's record, with and without the limiter.
run "t_capture record (baseline)" "$B/tests/t_capture" record "$here/real-gpu/h100-driver-facts.txt"
run "t_capture record" limited DRAGPU_MEMORY_LIMIT=1Gi DRAGPU_CORES_LIMIT=30 "$B/tests/t_capture" record \
    "$here/real-gpu/h100-driver-facts.txt"

run "compute unlimited" limited "$B/tests/t_compute" 100 1
for c in 10 30 50 70; do
    run "compute ${c}%" limited DRAGPU_CORES_LIMIT=$c "$B/tests/t_compute" $c 1.5
done
run "compute 30%, 2 processes" limited DRAGPU_CORES_LIMIT=30 "$B/tests/t_compute" 30 1.5 2
# The CUDA 2.0 launches and the multi-device cooperative launch (deprecated, still declared) are throttled too.
run "t_entrypoints busy 30%" limited FAKE_CUDA_REAL_TIMING=1 DRAGPU_CORES_LIMIT=30 "$B/tests/t_entrypoints" busy 30
# Launches the limiter must find the device of: another device's stream, no current context, long kernels.
for sc in other-device no-context long-kernels; do
    run "t_launch $sc" limited FAKE_CUDA_DEVICE_COUNT=2 DRAGPU_CORES_LIMIT=30 "$B/tests/t_launch" "$sc" 30 1.5
done
# Kernels of one function and grid whose times repeat a pattern (their data differs), with the real driver's
# gaps: the timed launches must not always be the same phase of it (timing every fourth gave 98 % for 30 %).
for c in 30 70; do
    run "t_launch periodic ${c}%" limited FAKE_CUDA_REAL_TIMING=1 DRAGPU_CORES_LIMIT=$c "$B/tests/t_launch" periodic $c 1.5
done
# A cold process's burst of 2 ms kernels: the first is measured before more are admitted at its cost.
run "t_launch cold-burst" limited DRAGPU_CORES_LIMIT=30 "$B/tests/t_launch" cold-burst 30 0.03
# Hostile shaping: a tenant that knows how the timed launches are drawn makes the others long (before the draws
# were keyed by getrandom: 100 % busy for 30 %); a stream of kinds that are each new (before: 200 ms of 200).
run "t_launch predicted" limited DRAGPU_CORES_LIMIT=30 "$B/tests/t_launch" predicted 30 1.5
run "t_launch changed" limited DRAGPU_CORES_LIMIT=30 "$B/tests/t_launch" changed 30 1.5
# ... learned at 2 us, measured from the change on: the launches charged the old estimate before a timed one showed
# the change are charged what they took (before: 54 % busy over 3 s for 30 %). A share: the plain build only.
[ -z "${LIMITER_SANITIZER_LIB:-}" ] && run "t_launch changed-short" limited DRAGPU_CORES_LIMIT=30 "$B/tests/t_launch" changed-short 30 3
run "t_launch new-kinds" limited DRAGPU_CORES_LIMIT=30 "$B/tests/t_launch" new-kinds 30 0.2
# ... a process that launches a 1 s kernel and goes quiet, beside another of the claim (before: 62 % for 30 %).
run "t_launch quiet" limited DRAGPU_CORES_LIMIT=30 "$B/tests/t_launch" quiet 30 3.5
# The real H100's launch latency, event ticks and host costs (FAKE_CUDA_REAL_TIMING=1): a bracket of events
# holds the launch's host time and the device's gap, which the limiter must not charge; short and long
# kernels within 1 point of the target, and the mixed load. The sanitizer builds slow the library's own path
# (TSan several times over) on a loaded machine: their share is held to 3 points, the plain build's to 1
# above the target and 3 below: a 2-core machine running the whole suite once gave 67.05 % for 70 % with
# 50 us kernels (70.1-70.2 % alone, 68.7 % for the library of the round before beside two busy loops),
# time the launcher lost that its run delay does not show. Above the target is what a neighbour would pay.
# Under TSan the launcher itself runs several times slower, and a loaded machine took it to 66.7 % for 70 %
# with 50 us kernels (67.1-70.1 % in ten runs; 68.1-70.0 % in five of the library before this round): below,
# those builds are held to 6 points; what they are for is the races.
# The sanitizer builds run the 30 % case of each kernel length only: the same code path as the other shares, which
# the plain build holds to its points (eight runs less per sanitizer build, about 30 s of the suite's time).
points=1
below=3
caps="10 30 50 70"
[ -n "${LIMITER_SANITIZER_LIB:-}" ] && points=3 && below=6 && caps=30
for us in 50 5000; do
    for c in $caps; do
        run "compute ${c}%, ${us} us kernels, H100 timing" limited FAKE_CUDA_REAL_TIMING=1 DRAGPU_CORES_LIMIT=$c \
            T_COMPUTE_KERNEL_US=$us T_COMPUTE_POINTS=$points T_COMPUTE_POINTS_BELOW=$below "$B/tests/t_compute" $c 1.5
    done
done
# Kernels of 2 us, launched by a host that takes 4 us a launch (the device is idle between them): a bracket's start
# event is reached while our last kernel still runs, at a time the queue's estimate cannot tell; the charge must be
# the kernel's, not the host's time (before: 6 % for 10 %, 15 % for 30 %, 25 % for 50 %). The launcher's own speed
# bounds the share here (about 46 % without the library, less on a loaded machine): 3 points above (30 % gave
# 29.8-32.8 % on a loaded 2-core machine); 3 and 5 below, and 50 % is held to 35. The plain build only: a
# sanitizer's slower launch path is what bounds the share there.
if [ -z "${LIMITER_SANITIZER_LIB:-}" ]; then
    for cb in 10:3 30:5 50:15; do
        c=${cb%:*}
        run "compute ${c}%, 2 us kernels, H100 timing" limited FAKE_CUDA_REAL_TIMING=1 FAKE_CUDA_WAVE_NS=2000 \
            DRAGPU_CORES_LIMIT=$c T_COMPUTE_KERNEL_US=10 T_COMPUTE_POINTS=3 T_COMPUTE_POINTS_BELOW=${cb#*:} \
            "$B/tests/t_compute" $c 1.5
    done
fi
# Another context holds the device most of the time: a start event it delays holds none of the launch's host
# time, which must then not be taken off the kernel's charge (the two-process overshoot on the H100: taking
# it off gives 32.4 % for 30 % here).
for c in 30 50; do
    run "compute ${c}%, 50 us kernels, H100 timing, a neighbour's context" limited FAKE_CUDA_REAL_TIMING=1 \
        FAKE_CUDA_NEIGHBOUR_BUSY_US=950 FAKE_CUDA_NEIGHBOUR_FREE_US=50 DRAGPU_CORES_LIMIT=$c T_COMPUTE_KERNEL_US=50 \
        T_COMPUTE_POINTS=$points T_COMPUTE_POINTS_BELOW=$below "$B/tests/t_compute" $c 1.5
done
run "compute 30%, H100 timing" limited FAKE_CUDA_REAL_TIMING=1 DRAGPU_CORES_LIMIT=30 "$B/tests/t_compute" 30 1.5
run "compute 30%, capture open" limited DRAGPU_CORES_LIMIT=30 T_COMPUTE_OPEN_CAPTURE=1 "$B/tests/t_compute" 30 1.5
# No timing events to be had: launches are timed by synchronising their stream (an upper bound).
run "compute without events, at most" limited DRAGPU_CORES_LIMIT=30 FAKE_CUDA_EVENT_CREATE_FAILS=1 \
    "$B/tests/t_compute" 30 1 1 at-most

echo "limiter tests ($(basename "$B")): $passed passed, $failed failed"
[ "$failed" -eq 0 ]
