#!/usr/bin/env bash
# A claim's limits come from the limits file the node agent wrote (CLAIMS_ROOT/<uid>/limits), not from the
# process: the environment can only lower them, a process that points DRAGPU_LIMITER_STATE_DIR elsewhere
# still shares its claim's accounting, several claims keep their own limits and regions, and every problem
# (malformed file, unusable state directory, all slots taken, the region's lock held) refuses allocations
# with one line saying why instead of running unlimited.
#
#   tests/t_limits.sh <build dir> <LD_PRELOAD prefix (sanitizer runtime) or ""> <claims root of the test library>
set -u
B=$1
LIB="${2:+$2 }$B/testroot/libdragpu-limiter.so.1"
ROOT=$3
probe=$B/limiter-probe
tmp=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
    rm -rf "$tmp" "$ROOT"
}
trap cleanup EXIT
fail() { echo "t_limits: $*" >&2; exit 1; }
expect_in() { grep -qF -- "$1" "$2" || fail "expected '$1' in $2:
$(cat "$2")"; }
GPU0=GPU-4a5c1e2d-7b3f-4e11-9a60-000000000000
GPU1=GPU-4a5c1e2d-7b3f-4e11-9a60-000000000001
MiB=1048576
chunk=$((256 * MiB))

# claim <uid> <namespace/name> <device lines...>: writes ROOT/<uid>/limits (read-only) and the state dir.
claim() {
    local uid=$1 name=$2
    shift 2
    mkdir -p "$ROOT/$uid" "$tmp/state-$uid"
    {
        echo "# written by the node agent"
        echo "version=1"
        echo "claim=$name"
        echo "state=$tmp/state-$uid"
        for d in "$@"; do echo "device=$d"; done
    } >"$ROOT/$uid/limits"
    chmod 0444 "$ROOT/$uid/limits"
}
# run_probe <out> <env...> -- <probe args...>
run_probe() {
    local out=$1
    shift
    local envs=()
    while [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    env LD_PRELOAD="$LIB" "${envs[@]}" "$probe" "$@" >"$out" 2>"$out.err" || fail "probe $* failed: $(cat "$out.err")"
}
# hold <out> <env...> -- <probe args>: a background holder; waits for it to hold its memory.
hold() {
    local out=$1
    shift
    local envs=()
    while [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    env LD_PRELOAD="$LIB" "${envs[@]}" "$probe" "$@" --hold >"$out" 2>"$out.err" &
    pids+=($!)
    for _ in $(seq 200); do grep -q holding "$out" && return 0; sleep 0.05; done
    fail "the holder did not start: $(cat "$out" "$out.err")"
}
# lock_bytes <file> <first byte> <count>: a background process holds write locks (OFD) on those bytes, as a
# process of the claim holding the region's lock or its slots would; waits until it does.
lock_bytes() {
    python3 - "$@" >"$tmp/locker" 2>&1 <<'EOF' &
import fcntl, os, struct, sys, time
fd = os.open(sys.argv[1], os.O_RDWR)
for off in range(int(sys.argv[2]), int(sys.argv[2]) + int(sys.argv[3])):
    fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack("hhqqi4x", fcntl.F_WRLCK, 0, off, 1, 0))
print("locked", flush=True)
time.sleep(60)
EOF
    pids+=($!)
    for _ in $(seq 200); do grep -q locked "$tmp/locker" && break; sleep 0.05; done
}
reset() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; wait "$p" 2>/dev/null; done; pids=(); rm -rf "$ROOT" "$tmp"/state-*; }

# 1. The file's limit applies with no DRAGPU_* variable at all; the region is in the file's state dir.
claim c1 ns/one "$GPU0 memory=1073741824 cores=100"
run_probe "$tmp/o1" -- alloc $chunk
expect_in "allocated=1073741824 last=CUDA_ERROR_OUT_OF_MEMORY" "$tmp/o1"
[ -f "$tmp/state-c1/dragpu-limiter.region" ] || fail "no region in the claim's state directory"
perm=$(stat -c %a "$tmp/state-c1/dragpu-limiter.region")
[ "$perm" = 660 ] || fail "the region file is mode $perm, expected 660 (not world-writable)"

# 2. The environment can lower the limit, never raise it.
run_probe "$tmp/o2" DRAGPU_MEMORY_LIMIT=8Gi DRAGPU_MEMORY_LIMIT_BY_UUID=$GPU0=8Gi DRAGPU_MEMORY_LIMIT_0=8Gi -- alloc $chunk
expect_in "allocated=1073741824 last=CUDA_ERROR_OUT_OF_MEMORY" "$tmp/o2"
run_probe "$tmp/o3" DRAGPU_MEMORY_LIMIT=512Mi -- alloc $chunk
expect_in "allocated=536870912 last=CUDA_ERROR_OUT_OF_MEMORY" "$tmp/o3"
run_probe "$tmp/o3i" DRAGPU_MEMORY_LIMIT=8Gi -- info
expect_in "total=1073741824" "$tmp/o3i"

# 3. Pointing at another state directory gets nothing more: both processes count against the claim.
mkdir -p "$tmp/elsewhere-a" "$tmp/elsewhere-b"
hold "$tmp/h4" DRAGPU_LIMITER_STATE_DIR="$tmp/elsewhere-a" -- alloc $chunk 3
run_probe "$tmp/o4" DRAGPU_LIMITER_STATE_DIR="$tmp/elsewhere-b" -- alloc $chunk
expect_in "allocated=268435456 last=CUDA_ERROR_OUT_OF_MEMORY" "$tmp/o4"
reset

# 4. Two claims in one container: each device keeps its claim's limit and its claim's region.
claim c1 ns/one "$GPU0 memory=1073741824 cores=100"
claim c2 ns/two "$GPU1 memory=2147483648 cores=100"
run_probe "$tmp/o5" FAKE_CUDA_DEVICE_COUNT=2 -- alloc $chunk
expect_in "allocated=1073741824 last=CUDA_ERROR_OUT_OF_MEMORY" "$tmp/o5"
run_probe "$tmp/o6" CUDA_VISIBLE_DEVICES=$GPU1 -- alloc $chunk
expect_in "allocated=2147483648 last=CUDA_ERROR_OUT_OF_MEMORY" "$tmp/o6"
[ -f "$tmp/state-c2/dragpu-limiter.region" ] || fail "the second claim's region is not in its own state directory"
reset

# 5. A malformed limits file: one line naming the file, the line and the problem; nothing is allocated.
claim c1 ns/one "$GPU0 memory=1073741824 cores=100"
chmod u+w "$ROOT/c1/limits" && echo "colour=blue" >>"$ROOT/c1/limits"
run_probe "$tmp/o7" DRAGPU_MEMORY_LIMIT=8Gi -- alloc $chunk
expect_in "allocated=0 last=CUDA_ERROR_OUT_OF_MEMORY" "$tmp/o7"
expect_in "dragpu-limiter: error: $ROOT/c1/limits: line 6: unknown or repeated key 'colour'; refusing allocations on this claim's devices" "$tmp/o7.err"
[ "$(grep -c dragpu-limiter "$tmp/o7.err")" -eq 1 ] || fail "expected one line, got: $(cat "$tmp/o7.err")"
# ... one whose devices cannot even be read refuses on every device.
printf 'version=2\n' >"$ROOT/c1/limits"
run_probe "$tmp/o8" CUDA_VISIBLE_DEVICES=$GPU1 -- alloc $chunk
expect_in "allocated=0 last=CUDA_ERROR_OUT_OF_MEMORY" "$tmp/o8"
expect_in "unsupported version 2" "$tmp/o8.err"
reset

# 6. The claim's state directory is missing: refused, never unlimited.
claim c1 ns/one "$GPU0 memory=1073741824 cores=100"
rm -rf "$tmp/state-c1"
run_probe "$tmp/o9" -- alloc $chunk
expect_in "allocated=0 last=CUDA_ERROR_OUT_OF_MEMORY" "$tmp/o9"
expect_in "cannot open the shared region $tmp/state-c1/dragpu-limiter.region (claim ns/one): No such file or directory; refusing allocations on its devices" "$tmp/o9.err"
reset

# 7. Every process slot taken, or the region's lock held by a process that never lets go: refused after
#    a bounded wait (the probe returns), never unlimited.
claim c1 ns/one "$GPU0 memory=1073741824 cores=100"
run_probe "$tmp/o10" -- info
region=$tmp/state-c1/dragpu-limiter.region
lock_bytes "$region" 1 1024
run_probe "$tmp/o11" -- alloc $chunk
expect_in "allocated=0 last=CUDA_ERROR_OUT_OF_MEMORY" "$tmp/o11"
expect_in "all process slots are in use; refusing allocations on its devices" "$tmp/o11.err"
kill -9 "${pids[@]}"; wait 2>/dev/null; pids=()
lock_bytes "$region" 0 1
timeout 20 env LD_PRELOAD="$LIB" "$probe" alloc $chunk >"$tmp/o12" 2>"$tmp/o12.err" || fail "a held region lock hung the probe"
expect_in "allocated=0 last=CUDA_ERROR_OUT_OF_MEMORY" "$tmp/o12"
expect_in "cannot lock the shared region $region (claim ns/one)" "$tmp/o12.err"
reset

# 7b. The claim outlived an upgrade of the library: a region of the old layout (version 1) is made again once
#     no process uses it; while one does (it holds a slot), refused with one line saying so.
claim c1 ns/one "$GPU0 memory=1073741824 cores=100"
region=$tmp/state-c1/dragpu-limiter.region
python3 - "$region" <<'EOF'
import struct, sys
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("=QIIIIII", 0x314C504741524444, 1, 4096, 1024, 192, 16, 0))
    f.truncate(4096 + 1024 * 192)
EOF
lock_bytes "$region" 1 1
run_probe "$tmp/o12b" -- alloc $chunk
expect_in "allocated=0 last=CUDA_ERROR_OUT_OF_MEMORY" "$tmp/o12b"
expect_in "cannot use the shared region $region (claim ns/one): a process of the claim still uses it with another version of the library (another layout); refusing allocations on its devices" "$tmp/o12b.err"
kill -9 "${pids[@]}"; wait 2>/dev/null; pids=()
run_probe "$tmp/o12c" DRAGPU_LOG_LEVEL=info -- alloc $chunk
expect_in "allocated=1073741824 last=CUDA_ERROR_OUT_OF_MEMORY" "$tmp/o12c"
expect_in "made the shared region $region (claim ns/one) again: no process uses its old layout any more" "$tmp/o12c.err"
[ "$(stat -c %s "$region")" = 233472 ] || fail "the region was not made again in the current layout"
reset

# 8. The file's compute share applies without DRAGPU_CORES_LIMIT, and the environment cannot raise it.
claim c1 ns/one "$GPU0 memory=unlimited cores=30"
env LD_PRELOAD="$LIB" DRAGPU_CORES_LIMIT=100 "$B/tests/t_compute" 30 1 >"$tmp/o13" 2>&1 ||
    fail "the file's 30% share did not hold: $(cat "$tmp/o13")"
reset

# 9. As in a claim's container: the library comes from /etc/ld.so.preload (the CDI spec mounts it), no
#    DRAGPU_* or LD_PRELOAD is set, and an image's own LD_PRELOAD is kept beside it. Needs root for a
#    private mount namespace; only the plain build (a sanitizer runtime would have to come first).
preload="skipped (needs root and unshare)"
if [ -z "$2" ] && [ "$(id -u)" = 0 ] && unshare --mount --propagation private true 2>/dev/null; then
    claim c1 ns/one "$GPU0 memory=1073741824 cores=100"
    unshare --mount --propagation private sh -c '
        mount -t tmpfs none /etc && echo "$1" >/etc/ld.so.preload || exit 1
        env -u LD_PRELOAD "$2" alloc "$3" >"$4" 2>&1
        LD_PRELOAD="$5" cat /proc/self/maps >"$4.maps"' sh \
        "$B/testroot/libdragpu-limiter.so.1" "$probe" $chunk "$tmp/o14" "$B/tests/libnext_b.so" ||
        fail "could not run under /etc/ld.so.preload: $(cat "$tmp/o14")"
    expect_in "allocated=1073741824 last=CUDA_ERROR_OUT_OF_MEMORY" "$tmp/o14"
    expect_in "libdragpu-limiter.so" "$tmp/o14.maps"
    expect_in "libnext_b.so" "$tmp/o14.maps"
    reset
    preload="checked"
fi

echo "t_limits: ok (file limits, environment only lowers, state dir pinned, two claims, fail closed; ld.so.preload $preload)"
