#!/usr/bin/env bash
# Elastic compute's figures on the fake driver, with the real driver's costs modelled (FAKE_CUDA_REAL_TIMING=1:
# launch latency, event ticks, host costs): floors under contention (2-4 claims; 50 us kernels, 5 ms kernels,
# graphs), a standard claim alone with ceiling 100, reclaim time (p50/p95), a latency claim's p99 beside a
# besteffort claim against alone and the besteffort claim's part of the idle time, and the throttled launch's
# bookkeeping with arbitration. Each claim is a process of its own, with the agent's board and activity files
# laid out as the agent makes them (tests/elastic_agent.sh). The fake gives each process a simulated GPU of its
# own: a figure is the share each claim's admission allowed; one claim's queue does not delay another's kernels
# there (on a real GPU it does: the GPU check measures that). Also: a claim alone against the same launcher without
# the library for each kernel length, the sum admitted with mixed kernel lengths, fixed caps of 10-90 % for steady
# kernels of 2 us, 50 us and 5 ms, and a kind learned short that turns long. Figures only; nothing asserted.
#
#   bench/elastic.sh <build dir> [short]   (make bench-elastic; as root, or where user namespaces are allowed;
#                                          short: only the short kernels' figures)
set -u
if [ -z "${ELASTIC_BENCH_NS:-}" ]; then
    export ELASTIC_BENCH_NS=1
    if [ "$(id -u)" = 0 ]; then exec unshare --mount --propagation private "$0" "$@"; fi
    exec unshare --map-root-user --mount --propagation private "$0" "$@"
fi
B=$(cd "$1" && pwd)
here=$(cd "$(dirname "$0")/.." && pwd)
LIB=$B/testroot/libdragpu-limiter.so.1
ROOT=$B/claims
GPUS=$B/gpus
GPU=GPU-4a5c1e2d-7b3f-4e11-9a60-000000000000
worker=$B/tests/t_elastic
for v in $(env | sed -n 's/^\(DRAGPU_[A-Za-z0-9_]*\)=.*/\1/p; s/^\(FAKE_CUDA_[A-Za-z0-9_]*\)=.*/\1/p'); do unset "$v"; done
export LD_LIBRARY_PATH="$B/fake" FAKE_CUDA_SM_COUNT=132 FAKE_CUDA_WAVE_NS=10000 FAKE_CUDA_CTX_BYTES=0
export FAKE_CUDA_REAL_TIMING=1
fail() { echo "elastic bench: $*" >&2; exit 1; }
. "$here/tests/elastic_agent.sh"
lay_out_gpus
field() { sed -n "s/.*$1=\([0-9.]*\).*/\1/p" "$2"; }
calc() { awk "BEGIN { printf \"%.6f\", $1 }"; }
t0() { calc "$("$worker" now) + $1"; }
finish() {
    for p in "${pids[@]}"; do wait "$p" || fail "a worker failed: $(cat "$tmp"/*.err)"; done
    pids=()
}

# claims: uid floor ceiling class (every one is on the board; an idle one lends its floor)
for c in "a2 30 100 standard" "b2 50 50 standard" "a3 20 100 standard" "b3 30 30 standard" "c3 40 100 standard" \
    "a4 20 100 standard" "b4 30 30 standard" "c4 25 100 standard" "d4 25 25 standard" "alone 30 100 standard" \
    "lat 30 100 latency" "be 10 100 besteffort" "bk 99 99 standard"; do
    # shellcheck disable=SC2086
    claim $c
done

# alone <label> <wave ns> <worker's kernel us> [graph]: a 30/100 claim alone, then the same launcher without the library.
alone_row() {
    local label=$1 wave=$2 us=$3 how=${4:-} run b s e lib none
    for run in library none; do
        b=$(t0 0.4) s=$(t0 0.8) e=$(t0 2.0)
        if [ "$run" = library ]; then
            FAKE_CUDA_WAVE_NS=$wave start alone "$tmp/alone-$run" run "$b" "$s" "$e" "$us" $how
        else
            FAKE_CUDA_WAVE_NS=$wave "$worker" run "$b" "$s" "$e" "$us" $how >"$tmp/alone-$run" 2>"$tmp/alone-$run.err" &
            pids+=($!)
        fi
        finish
    done
    lib=$(field busy "$tmp/alone-library") none=$(field busy "$tmp/alone-none")
    printf '  %-14s: library %6.2f %%  no library %6.2f %%  (%+.2f points; while each ran: %s / %s %%)\n' \
        "$label" "$lib" "$none" "$(calc "$lib - $none")" "$(field ran "$tmp/alone-library")" "$(field ran "$tmp/alone-none")"
}
echo "== a 30/100 claim alone, borrowing the idle GPU: busy % of the window, with the library and without it"
echo "   (goal: >= min(100, the no-library figure) - 1 point)"
alone_row "2 us kernels" 2000 10
[ "${2:-}" = short ] || {
    alone_row "10 us kernels" 10000 10
    alone_row "50 us kernels" 10000 50
    alone_row "5 ms kernels" 10000 5000
    alone_row "50 us graphs" 10000 50 graph
}
echo "== a throttled launch's bookkeeping while borrowing (a 30/100 claim alone; goal < 200 ns over a fixed share's)"
(
    worker=$B/bench/limiter-bench
    unset FAKE_CUDA_REAL_TIMING
    FAKE_CUDA_WAVE_NS=0 start alone "$tmp/bb" 2000000 throttled
    finish
    sed -n 's/^/  /; /compute limit on/p' "$tmp/bb"
)
[ "${2:-}" = short ] && exit 0

echo "== floors under contention: each claim's busy % of the window (its floor; ceiling), every claim busy"
for kind in "50 kernels" "5000 kernels" "50 graph"; do
    set -- $kind
    us=$1 how=$2
    for set in "a2:30 b2:50" "a3:20 b3:30 c3:40" "a4:20 b4:30 c4:25 d4:25"; do
        b=$(t0 0.4) s=$(t0 0.8) e=$(t0 2.0)
        for c in $set; do start "${c%:*}" "$tmp/f-${c%:*}" run "$b" "$s" "$e" "$us" $([ "$how" = graph ] && echo graph); done
        finish
        line="" worst=1000 total=0
        for c in $set; do
            busy=$(field busy "$tmp/f-${c%:*}")
            total=$(calc "$total + $busy")
            margin=$(calc "$busy - ${c#*:}")
            worst=$(calc "$margin < $worst ? $margin : $worst")
            line="$line ${c%:*} $busy (${c#*:})"
        done
        printf '  %d claims, %5s us %-7s:%s  | all %.2f %%, worst claim %+.1f points from its floor\n' \
            "$(echo "$set" | wc -w)" "$us" "$how" "$line" "$total" "$worst"
    done
done

echo "== sum admitted: 4 claims with floors summing to 100 %, two with 50 us kernels and two with 5 ms (goal <= 101 %)"
for r in 1 2 3; do
    b=$(t0 0.4) s=$(t0 0.8) e=$(t0 2.0)
    start a4 "$tmp/m-a4" run "$b" "$s" "$e" 50
    start b4 "$tmp/m-b4" run "$b" "$s" "$e" 50
    start c4 "$tmp/m-c4" run "$b" "$s" "$e" 5000
    start d4 "$tmp/m-d4" run "$b" "$s" "$e" 5000
    finish
    total=0 line=""
    for c in a4:20 b4:30 c4:25 d4:25; do
        busy=$(field busy "$tmp/m-${c%:*}")
        total=$(calc "$total + $busy")
        line="$line ${c%:*} $busy (${c#*:})"
    done
    printf '  run %d:%s  | all %.2f %%\n' "$r" "$line" "$total"
done

echo "== reclaim: a 30/100 claim borrows; a fixed 50 % claim wakes 20 times (every 250 ms, for 100 ms)"
echo "   time from a wake until the borrower's 5 ms average is back at its share (50 %) + 5 points, 1 ms bins"
b=$(t0 0.5)
T_ELASTIC_BIN_MS=1 start a2 "$tmp/borrower" run "$b" "$b" "$(calc "$b + 5.6")" 50
start b2 "$tmp/waker" wake "$(calc "$b + 0.3")" 0.25 0.1 20 50
finish
python3 - "$b" "$tmp/borrower" "$tmp/waker" <<'EOF'
import re, sys
begin = float(sys.argv[1])
bins = [float(x) for x in re.search(r"bins=([0-9.,]*)", open(sys.argv[2]).read()).group(1).split(",") if x]
wakes = [float(x) for x in re.search(r"wakes=([0-9.,]*)", open(sys.argv[3]).read()).group(1).split(",") if x]
times = []
for w in wakes:
    k0 = int((w - begin) * 1000)
    for k in range(k0, min(k0 + 100, len(bins) - 5)):
        if sum(bins[k:k + 5]) / 5 <= 55:
            times.append(k + 5 - k0)  # the end of the first 5 ms at the share
            break
    else:
        times.append(100)
times.sort()
def pct(p):
    return times[min(len(times) - 1, int(round(p / 100 * (len(times) - 1))))]
print(f"  {len(times)} wakes: reclaim p50 {pct(50)} ms, p95 {pct(95)} ms, max {times[-1]} ms (goal p95 <= 100, stretch 10)")
EOF

echo "== a latency claim (30/100): a 2 ms request every 6.67 ms (30 % duty), alone and beside a besteffort"
echo "   claim (10/100) running 50 us kernels all the time"
b=$(t0 0.4) s=$(t0 0.7) e=$(t0 3.7)
start lat "$tmp/lat-alone" duty "$b" "$s" "$e" 2000 6667
finish
b=$(t0 0.4) s=$(t0 0.7) e=$(t0 3.7)
start lat "$tmp/lat-beside" duty "$b" "$s" "$e" 2000 6667
start be "$tmp/be" run "$b" "$s" "$e" 50
finish
alone=$(field p99_us "$tmp/lat-alone")
beside=$(field p99_us "$tmp/lat-beside")
lat_busy=$(field busy "$tmp/lat-beside")
be_busy=$(field busy "$tmp/be")
printf '  p99 alone %s us, beside besteffort %s us: %.3f x (goal <= 1.10); p50 %s / %s us\n' "$alone" "$beside" \
    "$(calc "$beside / $alone")" "$(field p50_us "$tmp/lat-alone")" "$(field p50_us "$tmp/lat-beside")"
printf '  besteffort busy %s %% of the %.2f %% the latency claim left idle: %.0f %% of it (goal >= 50)\n' "$be_busy" \
    "$(calc "100 - $lat_busy")" "$(calc "100 * $be_busy / (100 - $lat_busy)")"

echo "== a fixed cap (no board), steady kernels of one length, the real driver's costs: busy % of the window (goal:"
echo "   within 1 point of the cap, or of what the launcher reaches without the library where that is less)"
for k in "2 2000 10" "50 10000 50" "5000 10000 5000"; do
    set -- $k
    line=""
    for c in 10 30 50 70 90 100; do
        out=$(FAKE_CUDA_WAVE_NS=$2 T_COMPUTE_KERNEL_US=$3 T_COMPUTE_POINTS=100 LD_PRELOAD="$B/libdragpu-limiter.so.1" \
            DRAGPU_CORES_LIMIT=$c DRAGPU_LIMITER_STATE_DIR="$(mktemp -d "$tmp/s.XXXX")" "$B/tests/t_compute" $c \
            $([ $c = 100 ] && echo 1 || echo 1.5) 2>&1)
        line="$line $(printf '%s' "$out" | sed -n 's/.*busy *\([0-9.]*\)%.*/\1/p' | head -1)"
    done
    printf '  %4s us kernels, caps 10 30 50 70 90 %%, and no cap:%s\n' "$1" "$line"
done
echo "== a kind learned short that turns long (1 ms), 30 % fixed cap: busy % of the first 1 s and 3 s after the change"
echo "   (goal: charged what it takes within one window; <= 31 over the windows after it)"
for sc in changed changed-short; do
    line=""
    for w in 1 3; do
        out=$(FAKE_CUDA_WAVE_NS=10000 T_LAUNCH_WARM_S=0 LD_PRELOAD="$B/libdragpu-limiter.so.1" DRAGPU_CORES_LIMIT=30 \
            DRAGPU_LIMITER_STATE_DIR="$(mktemp -d "$tmp/s.XXXX")" "$B/tests/t_launch" $sc 30 $w 2>&1)
        line="$line $(printf '%s' "$out" | sed -n 's/.*busy *\([0-9.]*\)%.*/\1/p' | head -1)"
    done
    printf '  learned at %s: busy over 1 s / 3 s:%s\n' "$([ $sc = changed ] && echo "20 us" || echo " 2 us")" "$line"
done
echo "== a throttled launch's bookkeeping with arbitration (a 99 % claim at its floor, 12 other claims on the board)"
unset FAKE_CUDA_REAL_TIMING
worker=$B/bench/limiter-bench
FAKE_CUDA_WAVE_NS=0 start bk "$tmp/bk" 2000000 throttled
finish
sed -n 's/^/  /; /compute limit on/p' "$tmp/bk"
echo "   ... and without a board (a fixed share), and unthrottled:"
FAKE_CUDA_WAVE_NS=0 LD_PRELOAD="$B/libdragpu-limiter.so.1" DRAGPU_CORES_LIMIT=99 DRAGPU_LIMITER_STATE_DIR="$(mktemp -d "$tmp/s.XXXX")" \
    "$worker" 2000000 throttled | sed -n 's/^/  /; /compute limit on/p'
FAKE_CUDA_WAVE_NS=0 LD_PRELOAD="$B/libdragpu-limiter.so.1" DRAGPU_LIMITER_STATE_DIR="$(mktemp -d "$tmp/s.XXXX")" \
    "$worker" 2000000 | sed -n 's/^/  /; /no compute limit/p'
