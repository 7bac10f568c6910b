#!/usr/bin/env bash
# Produces the Debian base images the Dockerfile starts from, locally, from the apt mirror this machine
# already uses: for machines that reach an apt mirror but no container registry (CI). Each image is a
# minbase Debian (what the official slim images are), imported under the short name the Dockerfile's
# FROM lines use, so a build finds it locally and pulls nothing.
#
# usage: tools/base-images.sh [--print]
#   --print   only print the image names the Dockerfile needs, one a line
# Needs root, mmdebstrap and podman. An image that exists already is kept.
set -euo pipefail

root_dir="$(cd "$(dirname "$0")/.." && pwd)"
die() { echo "base-images: $*" >&2; exit 1; }

# The FROM images are the defaults of the Dockerfile's *_IMAGE build arguments: one source of truth.
mapfile -t images < <(sed -n 's/^ARG [A-Z_]*_IMAGE=\(debian:[a-z]*-slim\)$/\1/p' "$root_dir/Dockerfile")
[ "${#images[@]}" -gt 0 ] || die "no debian:<suite>-slim build arguments found in the Dockerfile"
if [ "${1:-}" = --print ]; then
  printf '%s\n' "${images[@]}"
  exit 0
fi

command -v podman >/dev/null || die "podman is not installed"
command -v mmdebstrap >/dev/null || die "mmdebstrap is not installed (Debian: apt-get install mmdebstrap)"
[ "$(id -u)" = 0 ] || die "run as root (mmdebstrap builds the root file system as root)"

# The host's own Debian mirror, unless MIRROR says otherwise.
mirror=${MIRROR:-$(apt-get indextargets --format '$(REPO_URI)' 2>/dev/null | grep -m1 '/debian/$' || true)}
[ -n "$mirror" ] || die "no Debian mirror in this machine's apt sources; set MIRROR"

for image in "${images[@]}"; do
  if podman image exists "$image"; then
    echo "base-images: $image exists" >&2
    continue
  fi
  suite=${image#debian:}
  suite=${suite%-slim}
  echo "base-images: building $image from $mirror ($suite, minbase)" >&2
  mmdebstrap --quiet --variant=minbase --format=tar \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
    "$suite" - "deb $mirror $suite main" </dev/null |
    podman import --quiet --change 'CMD=["bash"]' - "$image" >/dev/null
  podman image exists "$image" || die "importing $image failed"
done
