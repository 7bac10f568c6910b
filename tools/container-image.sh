#!/usr/bin/env bash
# Builds the local image the container tests run in, without any registry: a static busybox with its
# applet links, plus the loader and system libraries that the given dynamically linked programs need
# (found with ldd, copied from the host). The programs themselves are not copied: the tests mount the
# current build into each container, so rebuilding the limiter does not rebuild the image.
#
# The tag is a hash of everything that goes in (this script, busybox, each library's path and bytes),
# so a second run with the same inputs only checks that the image exists.
#
# usage: tools/container-image.sh [ELF...]
#   default ELFs: the limiter's probe, library and fake driver under native/limiter/build/
# prints the image reference (localhost/dra-gpu-test:<hash>) on stdout; needs podman and busybox-static.
set -euo pipefail

REPO=localhost/dra-gpu-test
root_dir="$(cd "$(dirname "$0")/.." && pwd)"

die() { echo "container-image: $*" >&2; exit 1; }

if [ "$#" -eq 0 ]; then
  build="$root_dir/native/limiter/build"
  set -- "$build/limiter-probe" "$build/libdragpu-limiter.so.1" "$build/fake/libcuda.so.1"
fi
for elf in "$@"; do
  [ -f "$elf" ] || die "$elf does not exist (build the limiter first: make -C native/limiter)"
done
command -v podman >/dev/null || die "podman is not installed (Debian: apt-get install podman runc)"

busybox=""
for candidate in /bin/busybox /usr/bin/busybox; do
  if [ -x "$candidate" ] && ! ldd "$candidate" >/dev/null 2>&1; then busybox=$candidate; break; fi
done
[ -n "$busybox" ] || die "no statically linked busybox found (Debian: apt-get install busybox-static)"

# System libraries only: a dependency resolved elsewhere (the fake driver found through an rpath, say)
# is the test's to mount, not the image's to freeze.
deps=""
for elf in "$@"; do
  out=$(ldd "$elf" 2>&1) || die "ldd $elf failed: $out"
  deps+=$(printf '%s\n' "$out" | awk '
    $2 == "=>" && $3 ~ /^\// { print $3; next }
    $1 ~ /^\// { print $1 }')$'\n'
done
mapfile -t lib_paths < <(printf '%s' "$deps" | grep -E '^/(usr/)?lib(64|32)?/' | sort -u)
[ "${#lib_paths[@]}" -gt 0 ] || die "ldd found no system libraries in: $*"

tag=$(
  {
    sha256sum "$0" | cut -d' ' -f1
    sha256sum "$busybox" | cut -d' ' -f1
    for lib in "${lib_paths[@]}"; do
      printf '%s %s\n' "$lib" "$(sha256sum "$(readlink -f "$lib")" | cut -d' ' -f1)"
    done
  } | sha256sum | cut -c1-16
)
image="$REPO:$tag"
if podman image exists "$image"; then
  echo "$image"
  exit 0
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
rootfs="$work/rootfs"
mkdir -p "$rootfs"/{bin,sbin,usr/bin,usr/sbin,usr/local/bin,usr/lib/x86_64-linux-gnu,etc,proc,sys,dev,var/run,root}
install -d -m 1777 "$rootfs/tmp"
cp "$busybox" "$rootfs/bin/busybox"
"$busybox" --list-full | while read -r applet; do
  [ "$applet" = bin/busybox ] || [ -e "$rootfs/$applet" ] || ln -s /bin/busybox "$rootfs/$applet"
done
for lib in "${lib_paths[@]}"; do
  mkdir -p "$rootfs$(dirname "$lib")"
  cp -L "$lib" "$rootfs$lib"
done
echo "root:x:0:0:root:/root:/bin/sh" >"$rootfs/etc/passwd"
echo "root:x:0:" >"$rootfs/etc/group"

tar -C "$rootfs" --numeric-owner --owner=0 --group=0 -cf "$work/rootfs.tar" .
echo "container-image: importing $image (busybox + ${#lib_paths[@]} libraries)" >&2
podman import --quiet --change 'CMD=["/bin/sh"]' "$work/rootfs.tar" "$image" >/dev/null
echo "$image"
