# Sourced by tests/t_elastic.sh and bench/elastic.sh: the node agent's part of elastic compute, as the agent lays
# it out (README.md, "Elastic compute"), and a claim's process started in a mount namespace that sees only its
# own claim. Expects: GPU (the fake's UUID), ROOT (the library's CLAIMS_ROOT), GPUS (its GPUs root), LIB
# (the library to preload), worker (the program claims run) and fail (a function); lay_out_gpus first.
# shellcheck shell=bash

# lay_out_gpus: a scratch directory (tmp), removed at exit with every worker and mount, and the agent's GPU
# directory seen read-only at GPUS (as the CDI mount shows it to a container).
lay_out_gpus() {
    tmp=$(mktemp -d)
    chmod 0755 "$tmp"
    pids=()
    trap cleanup EXIT
    mkdir -p "$tmp/gpus/$GPU" "$GPUS" "$ROOT"
    chmod 0755 "$tmp/gpus" "$tmp/gpus/$GPU"
    mount --bind "$tmp/gpus" "$GPUS" && mount -o remount,bind,ro "$GPUS" || fail "cannot bind-mount the GPUs root read-only"
}
cleanup() {
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
    umount -l "$GPUS" 2>/dev/null
    for f in "$tmp"/claims-*/*/limits; do umount "$f" 2>/dev/null; done
    rm -rf "$tmp"
}

claims=() # uid:floor:ceiling:priority[:flags] of every claim on the board
# board: the agent rewrites the whole board (seq odd, entries, seq even) in place.
board() {
    python3 - "$tmp/gpus/$GPU/board" "${claims[@]}" <<'EOF'
import os, struct, sys
path, entries = sys.argv[1], sys.argv[2:]
prio = {"latency": 0, "standard": 1, "besteffort": 2}
fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o444)
old = os.pread(fd, 24, 0)
seq = struct.unpack_from("<Q", old, 16)[0] if len(old) == 24 else 0
seq += 1 if seq % 2 == 0 else 2  # odd while it writes; an odd seq a killed writer left is passed
os.ftruncate(fd, 16384)
os.pwrite(fd, struct.pack("<8sIIQ", b"DGPUBRD1", 2, len(entries), seq), 0)
body = b""
for e in entries:
    uid, floor, ceiling, p, *flags = e.split(":")
    body += struct.pack("<128sIIII16x", uid.encode(), int(floor), int(ceiling), prio[p], int(flags[0]) if flags else 0)
os.pwrite(fd, body.ljust(16384 - 64, b"\0"), 64)
os.pwrite(fd, struct.pack("<8sIIQ", b"DGPUBRD1", 2, len(entries), seq + 1), 0)
os.fchmod(fd, 0o444)
EOF
}
# claim <uid> <floor> <ceiling> <priority> [<limits line's extra fields>]: as the agent prepares it.
claim() {
    local uid=$1 floor=$2 ceiling=$3 prio=$4 extra=${5-}
    # The state directory is the claim's own limiter directory under the claims root: the library takes a
    # limits file only with that state= (one a pod mounted elsewhere cannot name another claim's region).
    local dir=$tmp/claims-$uid/$uid state=$tmp/claims-$uid/$uid/limiter
    mkdir -p "$dir" "$state"
    chmod 0755 "$state"
    python3 - "$state/dragpu-limiter.region" "$tmp/gpus/$GPU/$uid.activity" <<'EOF'
import os, struct, sys, uuid
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)
os.write(fd, struct.pack("=QIIIIII", 0x314C504741524444, 3, 4096, 1024, 192, 16, 128))
os.ftruncate(fd, 4096 + 128 * 256 + 1024 * 192)
os.fchmod(fd, 0o666)
fd = os.open(sys.argv[2], os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)
boot = uuid.UUID(open("/proc/sys/kernel/random/boot_id").read().strip()).bytes
os.write(fd, struct.pack("<8sII40x16s", b"DGPUACT1", 2, 0, boot))
os.ftruncate(fd, 4096)
os.fchmod(fd, 0o666)
EOF
    ln "$tmp/gpus/$GPU/$uid.activity" "$state/$GPU.activity"
    local line="$GPU memory=unlimited cores=$floor"
    [ "$ceiling" != "$floor" ] && line="$line limit=$ceiling"
    [ "$prio" != standard ] && line="$line priority=$prio"
    printf 'version=1\nclaim=ns/%s\nstate=%s\ndevice=%s%s\n' "${uid:0:16}" "$ROOT/$uid/limiter" "$line" "$extra" >"$dir/limits"
    chmod 0444 "$dir/limits"
    mount --bind "$dir/limits" "$dir/limits" && mount -o remount,bind,ro "$dir/limits" || fail "cannot mount $dir/limits"
    claims+=("$uid:$floor:$ceiling:$prio")
    board
}
# mark <uid> <flags>: the agent's flags on the claim's board entry (1: the driver contradicts its activity file).
mark() {
    local i
    for i in "${!claims[@]}"; do
        case ${claims[$i]} in "$1":*) claims[$i]="$(echo "${claims[$i]}" | cut -d: -f1-4):$2" ;; esac
    done
    board
}
# start <uid> <out> <worker args...>: the claim's process, in a mount namespace that sees only its own claim.
start() {
    local uid=$1 out=$2
    shift 2
    unshare --mount --propagation private sh -c 'mount --rbind "$1" "$2" && shift 2 && exec "$@"' sh \
        "$tmp/claims-$uid" "$ROOT" env LD_PRELOAD="$LIB" "$worker" "$@" >"$out" 2>"$out.err" &
    pids+=($!)
}
finish() {
    for p in "${pids[@]}"; do wait "$p" || fail "a worker failed: $(cat "$tmp"/*.err)"; done
    pids=()
}
