#!/usr/bin/env bash
# A claim's limits come from the limits file the node agent wrote (CLAIMS_ROOT/<uid>/limits), not from the
# process: the environment can only lower them, a process that points DRAGPU_LIMITER_STATE_DIR elsewhere
# still shares its claim's accounting, several claims keep their own limits and regions, and every problem
# (malformed file, unusable state directory, all slots taken, the region's lock held) refuses allocations
# with one line saying why instead of running unlimited.
#
#   tests/t_limits.sh <build dir> <LD_PRELOAD prefix (sanitizer runtime) or ""> <claims root of the test library>
set -u
# The agent's files are mounts (the limits file read-only): the test makes them in a private mount namespace
# of its own (as root, or as root of a new user namespace), so nothing leaks into the machine's mounts.
if [ -z "${T_LIMITS_NS:-}" ]; then
    export T_LIMITS_NS=1
    if [ "$(id -u)" = 0 ]; then exec unshare --mount --propagation private "$0" "$@"; fi
    exec unshare --map-root-user --mount --propagation private "$0" "$@"
fi
B=$1
LIB="${2:+$2 }$B/testroot/libdragpu-limiter.so.1"
ROOT=$3
probe=$B/limiter-probe
tmp=$(mktemp -d)
chmod 0755 "$tmp" # other UIDs of a claim reach its state directory
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
    for f in "$ROOT"/*/limits "$ROOT"/*; do umount "$f" 2>/dev/null; done
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

# claim <uid> <namespace/name> <device lines...>: as the node agent prepares a claim: ROOT/<uid>/limits, a
# read-only mount of its own, and the state dir ROOT/<uid>/limiter (not writable by others) with the region the agent makes
# (laid out and sized, usable by every UID of the claim; src/dra_gpu/plugin/sharing/modes/limiter_region.py).
claim() {
    local uid=$1 name=$2
    shift 2
    mkdir -p "$ROOT/$uid/limiter"
    chmod 0755 "$ROOT/$uid/limiter"
    make_region "$ROOT/$uid/limiter/dragpu-limiter.region"
    {
        echo "# written by the node agent"
        echo "version=1"
        echo "claim=$name"
        echo "state=$ROOT/$uid/limiter"
        for d in "$@"; do echo "device=$d"; done
    } >"$ROOT/$uid/limits"
    chmod 0444 "$ROOT/$uid/limits"
    mount --bind "$ROOT/$uid/limits" "$ROOT/$uid/limits" && mount -o remount,bind,ro "$ROOT/$uid/limits" ||
        fail "cannot bind-mount the limits file read-only"
}
make_region() {
    python3 - "$1" <<'EOF'
import os, struct, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)
os.write(fd, struct.pack("=QIIIIII", 0x314C504741524444, 3, 4096, 1024, 192, 16, 128))
os.ftruncate(fd, 4096 + 128 * 256 + 1024 * 192)
os.fchmod(fd, 0o666)
EOF
}
# write_floor <file> <seq> <uuid> <bytes> <region count>: the node agent's floor (src/dra_gpu/limiter_abi/region.py)
write_floor() {
    python3 - "$@" <<'EOF'
import os, struct, sys
path, seq, uuid, used, region = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o444)
os.ftruncate(fd, 4096)
os.pwrite(fd, struct.pack("=QII", 0x314C464741524444, 1, 16), 0)
os.pwrite(fd, struct.pack("=Q", 2 * seq - 1), 16)
os.pwrite(fd, uuid.encode().ljust(48, b"\0") + struct.pack("=qq", used, region), 64)
os.pwrite(fd, struct.pack("=Q", 2 * seq), 16)
EOF
}
# limited_probe <env...> -- <probe args...>: sets probe_cmd to the probe under the limiter with those variables,
# and probe_args to its arguments.
limited_probe() {
    local envs=()
    while [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    probe_args=("$@")
    probe_cmd=(env LD_PRELOAD="$LIB" "${envs[@]}" "$probe" "$@")
}
# run_probe <out> <env...> -- <probe args...>
run_probe() {
    local out=$1
    shift
    limited_probe "$@"
    "${probe_cmd[@]}" >"$out" 2>"$out.err" || fail "probe ${probe_args[*]} failed: $(cat "$out.err")"
}
# hold <out> <env...> -- <probe args>: a background holder; waits for it to hold its memory.
hold() {
    local out=$1
    shift
    limited_probe "$@"
    "${probe_cmd[@]}" --hold >"$out" 2>"$out.err" &
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
reset() {
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
    pids=()
    for f in "$ROOT"/*/limits; do umount "$f" 2>/dev/null; done
    umount "$ROOT"/* 2>/dev/null
    rm -rf "$ROOT"
}

# 1. The file's limit applies with no DRAGPU_* variable at all; the region is in the file's state dir.
claim c1 ns/one "$GPU0 memory=1073741824 cores=100"
run_probe "$tmp/o1" -- alloc $chunk
expect_in "allocated=1073741824 last=CUDA_ERROR_OUT_OF_MEMORY" "$tmp/o1"
perm=$(stat -c %a "$ROOT/c1/limiter/dragpu-limiter.region")
[ "$perm" = 666 ] || fail "the library changed the agent's region to mode $perm"

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
reset

# 5. A malformed limits file: one line naming the file, the line and the problem; nothing is allocated.
claim c1 ns/one "$GPU0 memory=1073741824 cores=100"
umount "$ROOT/c1/limits" && chmod u+w "$ROOT/c1/limits" && echo "colour=blue" >>"$ROOT/c1/limits" &&
    mount --bind "$ROOT/c1/limits" "$ROOT/c1/limits" && mount -o remount,bind,ro "$ROOT/c1/limits"
run_probe "$tmp/o7" DRAGPU_MEMORY_LIMIT=8Gi -- alloc $chunk
expect_in "allocated=0 last=CUDA_ERROR_OUT_OF_MEMORY" "$tmp/o7"
expect_in "dragpu-limiter: error: $ROOT/c1/limits: line 6: unknown or repeated key 'colour'; refusing allocations on this claim's devices" "$tmp/o7.err"
[ "$(grep -c dragpu-limiter "$tmp/o7.err")" -eq 1 ] || fail "expected one line, got: $(cat "$tmp/o7.err")"
# ... one whose devices cannot even be read refuses on every device.
umount "$ROOT/c1/limits" && printf 'version=2\n' >"$ROOT/c1/limits" &&
    mount --bind "$ROOT/c1/limits" "$ROOT/c1/limits" && mount -o remount,bind,ro "$ROOT/c1/limits"
run_probe "$tmp/o8" CUDA_VISIBLE_DEVICES=$GPU1 -- alloc $chunk
expect_in "allocated=0 last=CUDA_ERROR_OUT_OF_MEMORY" "$tmp/o8"
expect_in "unsupported version 2" "$tmp/o8.err"
reset

# 6. The claim's state directory is missing: refused, never unlimited.
claim c1 ns/one "$GPU0 memory=1073741824 cores=100"
rm -rf "$ROOT/c1/limiter"
run_probe "$tmp/o9" -- alloc $chunk
expect_in "allocated=0 last=CUDA_ERROR_OUT_OF_MEMORY" "$tmp/o9"
expect_in "cannot open the shared region $ROOT/c1/limiter/dragpu-limiter.region (claim ns/one): No such file or directory; refusing allocations on its devices" "$tmp/o9.err"
reset

# 7. Every process slot taken, or the region's lock held by a process that never lets go: refused after
#    a bounded wait (the probe returns), never unlimited.
claim c1 ns/one "$GPU0 memory=1073741824 cores=100"
run_probe "$tmp/o10" -- info
region=$ROOT/c1/limiter/dragpu-limiter.region
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

# 7b. A claim's region of another layout (the claim outlived an upgrade of the library) is never made again
#     by the library - it is the agent's: refused with one line saying so.
claim c1 ns/one "$GPU0 memory=1073741824 cores=100"
region=$ROOT/c1/limiter/dragpu-limiter.region
python3 - "$region" <<'EOF'
import struct, sys
with open(sys.argv[1], "r+b") as f:
    f.write(struct.pack("=QIIIIII", 0x314C504741524444, 1, 4096, 1024, 192, 16, 0))
    f.truncate(4096 + 1024 * 192)
EOF
run_probe "$tmp/o12b" -- alloc $chunk
expect_in "allocated=0 last=CUDA_ERROR_OUT_OF_MEMORY" "$tmp/o12b"
expect_in "cannot use the shared region $region (claim ns/one): it was made for another version of the library (the claim must be prepared again); refusing allocations on its devices" "$tmp/o12b.err"
reset

# 7c. A process of the claim holds 768 MiB; another deletes, truncates or zeroes the region, or puts a FIFO in
#     its place. The next process does not start a fresh account: it refuses, in one line.
for how in delete truncate zero fifo; do
    claim c1 ns/one "$GPU0 memory=1073741824 cores=100"
    region=$ROOT/c1/limiter/dragpu-limiter.region
    hold "$tmp/h7c" -- alloc $((768 * MiB)) 1
    case $how in
    delete) rm -f "$region" ;;
    truncate) truncate -s 0 "$region" ;;
    zero) dd if=/dev/zero of="$region" bs=4096 count=57 conv=notrunc 2>/dev/null ;;
    fifo) rm -f "$region" && mkfifo -m 0666 "$region" ;;
    esac
    timeout 20 env LD_PRELOAD="$LIB" "$probe" alloc $chunk >"$tmp/o7c" 2>"$tmp/o7c.err" || fail "$how: the probe failed or hung"
    expect_in "allocated=0 last=CUDA_ERROR_OUT_OF_MEMORY" "$tmp/o7c"
    [ "$(grep -c dragpu-limiter "$tmp/o7c.err")" -eq 1 ] || fail "$how: expected one line, got: $(cat "$tmp/o7c.err")"
    expect_in "$region (claim ns/one)" "$tmp/o7c.err"
    reset
done

# 7d. A claim shared by pods of different UIDs: both account in the agent's region (one holds 768 MiB, each
#     of the others gets the remaining 256 MiB).
claim c1 ns/one "$GPU0 memory=1073741824 cores=100"
if [ -z "$2" ]; then # the sanitizer runtimes need not be readable by other users
    hold "$tmp/h7d" -- alloc $((768 * MiB)) 1
    for u in 1000 2000; do
        setpriv --reuid $u --regid $u --clear-groups env LD_PRELOAD="$LIB" "$probe" alloc $chunk >"$tmp/o7d" 2>&1 ||
            fail "uid $u: $(cat "$tmp/o7d")"
        expect_in "allocated=268435456 last=CUDA_ERROR_OUT_OF_MEMORY" "$tmp/o7d"
    done
fi
reset

# 7e. Limits files the container could have written: a plain file (container root's), and a file on a
#     read-only filesystem that is no mount of its own (an image's read-only root). Either fails closed, and
#     the forged "unlimited" never applies, even named to sort first: the agent's limit holds.
claim c1 ns/one "$GPU0 memory=1073741824 cores=100"
for how in plain rootfs; do
    mkdir -p "$ROOT/000-forged"
    [ $how = rootfs ] && mount -t tmpfs none "$ROOT/000-forged"
    printf 'version=1\nclaim=ns/forged\nstate=%s\ndevice=%s memory=unlimited cores=100\n' "$ROOT/c1/limiter" "$GPU0" \
        >"$ROOT/000-forged/limits"
    [ $how = rootfs ] && mount -o remount,ro "$ROOT/000-forged"
    run_probe "$tmp/o7f" -- alloc $chunk
    expect_in "allocated=1073741824 last=CUDA_ERROR_OUT_OF_MEMORY" "$tmp/o7f"
    expect_in "dragpu-limiter: error: $ROOT/000-forged/limits: not a read-only mount of the node agent's (the container could have written it); refusing allocations on this claim's devices" "$tmp/o7f.err"
    [ "$(grep -c dragpu-limiter "$tmp/o7f.err")" -eq 1 ] || fail "$how: expected one line, got: $(cat "$tmp/o7f.err")"
    [ $how = rootfs ] && umount "$ROOT/000-forged"
    rm -rf "$ROOT/000-forged"
done
reset

# 7f. A limits file that is a read-only mount of its own (a pod spec's ConfigMap with subPath under the claims
#     root) naming the real claim's state directory, unlimited, sorted first: it is not the agent's claim (its
#     state= is not its own directory's), so it fails closed and the agent's limit holds.
claim c1 ns/one "$GPU0 memory=1073741824 cores=100"
mkdir -p "$ROOT/000-forged" "$tmp/configmap"
printf 'version=1\nclaim=ns/forged\nstate=%s\ndevice=%s memory=unlimited cores=100\n' "$ROOT/c1/limiter" "$GPU0" \
    >"$tmp/configmap/limits"
touch "$ROOT/000-forged/limits"
mount --bind "$tmp/configmap/limits" "$ROOT/000-forged/limits" && mount -o remount,bind,ro "$ROOT/000-forged/limits" ||
    fail "cannot bind-mount the forged limits file read-only"
run_probe "$tmp/o7g" -- alloc $chunk
expect_in "allocated=1073741824 last=CUDA_ERROR_OUT_OF_MEMORY" "$tmp/o7g"
expect_in "dragpu-limiter: error: $ROOT/000-forged/limits: state=$ROOT/c1/limiter is not the claim's own state directory $ROOT/000-forged/limiter; refusing allocations on this claim's devices" "$tmp/o7g.err"
umount "$ROOT/000-forged/limits"
reset

# 7g. The node agent's floor (what NVML says the claim's processes hold): a process holds 768 MiB, the agent
#     samples it, another process zeroes the region's counters and asks for 512 MiB: refused, the floor says
#     768 MiB are held. Then the holder dies: an allocation that only the floor (now stale) refuses waits for
#     the agent's next sample and is admitted on it.
claim c1 ns/one "$GPU0 memory=1073741824 cores=100"
floor=$ROOT/c1/limiter/dragpu-limiter.floor
write_floor "$floor" 1 "$GPU0" 0 0
hold "$tmp/h7g" -- alloc $((768 * MiB)) 1
write_floor "$floor" 2 "$GPU0" $((768 * MiB)) $((768 * MiB))
python3 - "$ROOT/c1/limiter/dragpu-limiter.region" <<'EOF'
import sys
with open(sys.argv[1], "r+b") as f:  # device 0's claim-wide count, and every slot's
    f.seek(128)
    f.write(bytes(8))
    for slot in range(1024):
        f.seek(4096 + 128 * 256 + slot * 192 + 24)
        f.write(bytes(8 * 16))
EOF
run_probe "$tmp/o7h" -- alloc $((512 * MiB)) 1
expect_in "allocated=0 last=CUDA_ERROR_OUT_OF_MEMORY" "$tmp/o7h"
kill -9 "${pids[@]}"; wait 2>/dev/null; pids=()
(sleep 0.5 && write_floor "$floor" 3 "$GPU0" 0 0) &
pids+=($!)
run_probe "$tmp/o7i" -- alloc $((768 * MiB)) 1
expect_in "allocated=805306368 last=CUDA_SUCCESS" "$tmp/o7i"
reset

# 7h. A process of the claim holds 768 MiB, drops its slot's lock, names a dead process as the slot's owner and
#     marks it gone as the agent would: the next process's sweep refunds the region, but the agent's floor
#     (written after the allocation, as its watch would) keeps the 768 MiB charged.
claim c1 ns/one "$GPU0 memory=1073741824 cores=100"
write_floor "$ROOT/c1/limiter/dragpu-limiter.floor" 1 "$GPU0" 0 0
env LD_PRELOAD="$LIB" DRAGPU_LIMITER_STATE_DIR="$ROOT/c1/limiter" T_REGION_FLOOR="$ROOT/c1/limiter/dragpu-limiter.floor" \
    T_REGION_GPU="$GPU0" "$B/tests/t_region" forged >"$tmp/o7j" 2>&1 || fail "a forged refund: $(cat "$tmp/o7j")"
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

echo "t_limits: ok (file limits, environment only lowers, state dir pinned, two claims, fail closed, agent's region kept, forged limits refused; ld.so.preload $preload)"
