#!/usr/bin/env bash
# Library hygiene: exports exactly the wrappers listed in src/driver.h plus dlsym (and the version script
# agrees), depends on nothing but the C library (no libcuda: it is preloaded everywhere), has the SONAME
# libdragpu-limiter.so.1, no constructors or destructors, and no bare dlsym call outside the interposer.
#
#   tests/check_exports.sh <build dir>
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
lib=$1/libdragpu-limiter.so.1
fail() { echo "check_exports: $*" >&2; exit 1; }

hooks() { # the X(...) entries of one list macro in driver.h
    awk -v m="#define $1(X)" 'index($0, m) == 1 {on = 1; next} on {print; if ($0 !~ /\\$/) exit}' \
        "$here/src/driver.h" | sed -n 's/^ *X(\([A-Za-z0-9_]*\),.*/\1/p'
}
expected=$( (hooks DL_CUDA_HOOKED; hooks DL_NVML_HOOKED; echo dlsym; echo dlvsym) | sort)
exported=$(nm -D --defined-only "$lib" | awk '{print $3}' | sort)
mapped=$(sed -n '/global:/,/local:/p' "$here/libdragpu-limiter.map" | tr ' ;' '\n\n' |
    grep -E '^(cu|nvml|dlsym|dlvsym)' | sort)
[ -n "$expected" ] || fail "no hooks found in src/driver.h"
[ "$expected" = "$exported" ] || fail "exports differ from the hook tables:
$(diff <(echo "$expected") <(echo "$exported"))"
[ "$expected" = "$mapped" ] || fail "the version script differs from the hook tables:
$(diff <(echo "$expected") <(echo "$mapped"))"

# Each wrapper is declared with the type of the PFN_<base>_v<version>[_ptsz] typedef paired with it in
# driver.h (the compiler checks the prototype); the pairing itself must name the exported symbol of that
# ABI variant, as the fake's table derives it from src/cuda_min.h (checked against the toolkit).
table=$1/fake/proctable.c
[ -f "$table" ] || fail "no generated proc table at $table"
for list in DL_CUDA_HOOKED DL_CUDA_USED; do
    awk -v m="#define $list(X)" 'index($0, m) == 1 {on = 1; next} on {print; if ($0 !~ /\\$/) exit}' \
        "$here/src/driver.h" | sed -n 's/^ *X(\([A-Za-z0-9_]*\), *PFN_\([A-Za-z0-9]*\)_v\([0-9]*\)\(_pt[sd][sz]\)\{0,1\}).*/\1 \2 \3 \4/p'
done >"$1/pfn-pairs.txt"
[ "$(wc -l <"$1/pfn-pairs.txt")" -gt 40 ] || fail "could not read the PFN pairings of src/driver.h"
while read -r name base version pt; do
    grep -qF "{\"$base\", $version, $([ -n "$pt" ] && echo 1 || echo 0), \"$name\"," "$table" ||
        fail "$name is paired with PFN_${base}_v${version}${pt}, which is the ABI of another symbol"
done <"$1/pfn-pairs.txt"

soname=$(readelf -d "$lib" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ "$soname" = libdragpu-limiter.so.1 ] || fail "SONAME is '$soname'"
needed=$(readelf -d "$lib" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | grep -vE '^(libc\.so|ld-linux|libasan|libubsan|libtsan|libpthread|libdl)' || true)
[ -z "$needed" ] || fail "unexpected dependencies: $needed"
! grep -nE '__attribute__\(\((constructor|destructor)' "$here"/src/*.c || fail "constructors are not allowed"
bare=$(grep -nE '(^|[^_a-zA-Z])dlsym\(' "$here"/src/*.c | grep -v '^.*/dlsym\.c:' |
    grep -vE '^[^:]*:[0-9]+: *(/?\*|//)' || true)
[ -z "$bare" ] || fail "bare dlsym calls outside the interposer: $bare"
echo "$(echo "$expected" | wc -l) symbols exported, no constructors, depends on libc only"
