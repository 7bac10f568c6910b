#!/usr/bin/env bash
# Fail open, never crash: malformed settings are named in a warning and ignored; an unusable state
# directory degrades to a per-process limit with a warning; a process that never calls CUDA is left alone
# (no output, no files); the probe's command line is checked.
#
#   tests/t_failopen.sh <build dir> <LD_PRELOAD value>
set -u
B=$1
PRELOAD=$2
probe=$B/limiter-probe
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "t_failopen: $*" >&2; exit 1; }
expect_in() { grep -qF -- "$1" "$2" || fail "expected '$1' in $2:
$(cat "$2")"; }
fake_total=85899345920

# 1. Malformed values: each one warned about by name and value, none applied.
LD_PRELOAD=$PRELOAD DRAGPU_MEMORY_LIMIT=12XB DRAGPU_CORES_LIMIT=150 DRAGPU_LOG_LEVEL=loud \
    DRAGPU_MEMORY_LIMIT_BY_UUID=GPU-nope=1Gi DRAGPU_MEMORY_LIMIT_0=-5 \
    "$probe" info >"$tmp/out" 2>"$tmp/err" || fail "probe failed on malformed settings: $(cat "$tmp/err")"
expect_in 'dragpu-limiter: warn: ignoring malformed DRAGPU_MEMORY_LIMIT="12XB"' "$tmp/err"
expect_in 'ignoring malformed DRAGPU_CORES_LIMIT="150"' "$tmp/err"
expect_in 'ignoring malformed DRAGPU_LOG_LEVEL="loud"' "$tmp/err"
expect_in 'ignoring malformed DRAGPU_MEMORY_LIMIT_BY_UUID="GPU-nope=1Gi"' "$tmp/err"
expect_in 'ignoring malformed DRAGPU_MEMORY_LIMIT_0="-5"' "$tmp/err"
expect_in "total=$fake_total free=$fake_total" "$tmp/out"

# 2. A state directory that does not exist (mount missing): per-process limit, with a warning.
LD_PRELOAD=$PRELOAD DRAGPU_MEMORY_LIMIT=1Gi DRAGPU_LIMITER_STATE_DIR="$tmp/missing" \
    "$probe" alloc 268435456 >"$tmp/out" 2>"$tmp/err" || fail "probe failed: $(cat "$tmp/err")"
expect_in "cannot open the shared region $tmp/missing/dragpu-limiter.region (the environment's state directory): No such file or directory; limits apply to this process only" "$tmp/err"
expect_in "allocated=1073741824 last=CUDA_ERROR_OUT_OF_MEMORY" "$tmp/out"

# 2b. A state directory on a full disk (a 64 KiB tmpfs, in a user namespace of its own): the region is never a
# sparse file that faults when the process first writes a page of it, but refused when made, the same degradation.
mkdir "$tmp/full"
if unshare --map-root-user --mount true 2>/dev/null; then
    unshare --map-root-user --mount sh -c 'mount -t tmpfs -o size=64k tmpfs "$1" && shift && exec "$@"' sh "$tmp/full" \
        env LD_PRELOAD="$PRELOAD" DRAGPU_MEMORY_LIMIT=1Gi DRAGPU_LIMITER_STATE_DIR="$tmp/full" \
        "$probe" alloc 268435456 >"$tmp/out" 2>"$tmp/err" || fail "probe failed on a full disk: $(cat "$tmp/err")"
    expect_in "cannot use the shared region $tmp/full/dragpu-limiter.region (the environment's state directory): No space left on device; limits apply to this process only" "$tmp/err"
    expect_in "allocated=1073741824 last=CUDA_ERROR_OUT_OF_MEMORY" "$tmp/out"
else
    echo "t_failopen: the full disk is not tried: no user namespace for a small tmpfs here" >&2
fi

# 3. A region file of another layout (say, another version of the library): same degradation.
mkdir "$tmp/foreign" && head -c 4096 /dev/urandom >"$tmp/foreign/dragpu-limiter.region"
LD_PRELOAD=$PRELOAD DRAGPU_MEMORY_LIMIT=1Gi DRAGPU_LIMITER_STATE_DIR="$tmp/foreign" \
    "$probe" alloc 268435456 >"$tmp/out" 2>"$tmp/err" || fail "probe failed: $(cat "$tmp/err")"
expect_in "the file has an unknown layout" "$tmp/err"
expect_in "allocated=1073741824 last=CUDA_ERROR_OUT_OF_MEMORY" "$tmp/out"

# 4. A process that never calls CUDA: no output, no region file, nothing loaded.
mkdir "$tmp/quiet"
out=$(LD_PRELOAD=$PRELOAD DRAGPU_MEMORY_LIMIT=12XB DRAGPU_CORES_LIMIT=30 DRAGPU_LIMITER_STATE_DIR="$tmp/quiet" \
    sh -c 'echo hello; grep -c libcuda /proc/self/maps' 2>"$tmp/err")
[ "$out" = "hello
0" ] || fail "a shell under the limiter printed '$out'"
[ ! -s "$tmp/err" ] || fail "a shell under the limiter wrote to stderr: $(cat "$tmp/err")"
[ -z "$(ls -A "$tmp/quiet")" ] || fail "a process without CUDA created $(ls "$tmp/quiet")"

# 5. The probe's command line: usage errors exit 2 and say how to use it.
for args in "" "alloc" "alloc 1Gi" "alloc 0" "alloc 10 x" "frobnicate"; do
    # shellcheck disable=SC2086
    "$probe" $args >/dev/null 2>"$tmp/err"
    rc=$?
    [ $rc -eq 2 ] || fail "limiter-probe $args exited $rc, expected 2"
    expect_in "usage: limiter-probe info" "$tmp/err"
done
echo "t_failopen: ok"
