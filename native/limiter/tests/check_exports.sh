#!/usr/bin/env bash
# Library hygiene: exports exactly the wrappers listed in src/limiter.h plus dlsym (and the version script
# agrees), depends on nothing but the C library (no libcuda: it is preloaded everywhere), has the SONAME
# libdragpu-limiter.so.1, no constructors or destructors, and no bare dlsym call outside the interposer.
#
#   tests/check_exports.sh <build dir>
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
lib=$1/libdragpu-limiter.so.1
fail() { echo "check_exports: $*" >&2; exit 1; }

hooks() { # the X(...) entries of one list macro in limiter.h
    awk -v m="#define $1(X)" 'index($0, m) == 1 {on = 1; next} on {print; if ($0 !~ /\\$/) exit}' \
        "$here/src/limiter.h" | sed -n 's/^ *X(\([A-Za-z0-9_]*\),.*/\1/p'
}
expected=$( (hooks DL_CUDA_HOOKED; hooks DL_NVML_HOOKED; echo dlsym) | sort)
exported=$(nm -D --defined-only "$lib" | awk '{print $3}' | sort)
mapped=$(sed -n '/global:/,/local:/p' "$here/libdragpu-limiter.map" | tr ' ;' '\n\n' |
    grep -E '^(cu|nvml|dlsym)' | sort)
[ -n "$expected" ] || fail "no hooks found in src/limiter.h"
[ "$expected" = "$exported" ] || fail "exports differ from the hook tables:
$(diff <(echo "$expected") <(echo "$exported"))"
[ "$expected" = "$mapped" ] || fail "the version script differs from the hook tables:
$(diff <(echo "$expected") <(echo "$mapped"))"

soname=$(readelf -d "$lib" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ "$soname" = libdragpu-limiter.so.1 ] || fail "SONAME is '$soname'"
needed=$(readelf -d "$lib" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | grep -vE '^(libc\.so|ld-linux|libasan|libubsan|libpthread|libdl)' || true)
[ -z "$needed" ] || fail "unexpected dependencies: $needed"
! grep -nE '__attribute__\(\((constructor|destructor)' "$here"/src/*.c || fail "constructors are not allowed"
bare=$(grep -nE '(^|[^_a-zA-Z])dlsym\(' "$here"/src/*.c | grep -v '^.*/dlsym\.c:' |
    grep -vE '^[^:]*:[0-9]+: *(/?\*|//)' || true)
[ -z "$bare" ] || fail "bare dlsym calls outside the interposer: $bare"
echo "$(echo "$expected" | wc -l) symbols exported, no constructors, depends on libc only"
