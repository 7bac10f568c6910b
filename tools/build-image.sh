#!/usr/bin/env bash
# Builds the dra-gpu image (the Dockerfile at the top of the tree) with whichever builder is installed:
# docker (with a running daemon), podman or buildah; IMAGE_BUILDER=docker|podman|buildah picks one.
#
# usage: tools/build-image.sh [--values FILE] [--tag REF] [--push] [--archive FILE] [-- BUILD-ARGS...]
#   --values FILE   the values file the manifests are rendered from: the image reference is its
#                   image.repository and image.tag (the default values without it)
#   --tag REF       build REF instead (tests)
#   --push          push the image to its registry afterwards
#   --archive FILE  also write the image to FILE as a docker-archive (kind load image-archive FILE)
#   --builder       only print the builder that would be used (exit 3 when there is none)
# Prints the image reference on stdout; the builder's output goes to stderr.
set -euo pipefail

root_dir="$(cd "$(dirname "$0")/.." && pwd)"
die() { echo "build-image: $*" >&2; exit 2; }

values=() tag="" push=0 archive="" which=0
while [ "$#" -gt 0 ]; do
  case "$1" in
    --values) [ "$#" -ge 2 ] || die "--values needs a file"; values=(--values "$2"); shift 2 ;;
    --tag) [ "$#" -ge 2 ] || die "--tag needs an image reference"; tag=$2; shift 2 ;;
    --push) push=1; shift ;;
    --builder) which=1; shift ;;
    --archive) [ "$#" -ge 2 ] || die "--archive needs a file"; archive=$2; shift 2 ;;
    --) shift; break ;;
    *) die "unknown argument $1 (see the usage at the top of $0)" ;;
  esac
done

if [ "$which" = 0 ] && [ -z "$tag" ]; then
  dra_gpu="$root_dir/.venv/bin/dra-gpu"
  [ -x "$dra_gpu" ] || dra_gpu=$(command -v dra-gpu) || die "dra-gpu is not installed: run \`make venv\` first"
  tag=$("$dra_gpu" manifests "${values[@]}" --image) || exit $?
fi

builder=${IMAGE_BUILDER:-}
if [ -z "$builder" ]; then
  if command -v docker >/dev/null && docker info >/dev/null 2>&1; then builder=docker
  elif command -v podman >/dev/null; then builder=podman
  elif command -v buildah >/dev/null; then builder=buildah
  else
    echo "build-image: no image builder: install docker, podman or buildah" >&2
    exit 3
  fi
fi
command -v "$builder" >/dev/null || die "IMAGE_BUILDER=$builder is not installed"
if [ "$which" = 1 ]; then echo "$builder"; exit 0; fi

# The certificate authorities the build's Python package downloads trust (see the Dockerfile): pip's
# own setting, else this machine's trust store, so that a build behind a proxy with its own authority
# works wherever pip on this machine does. A build secret: not stored in the image.
secret=()
for ca in "${PIP_CERT:-}" "${REQUESTS_CA_BUNDLE:-}" "${SSL_CERT_FILE:-}" /etc/ssl/certs/ca-certificates.crt; do
  if [ -n "$ca" ] && [ -s "$ca" ]; then secret=(--secret "id=pip-ca,src=$ca"); break; fi
done

echo "build-image: building $tag with $builder" >&2
case "$builder" in
  docker) DOCKER_BUILDKIT=1 docker build -t "$tag" "${secret[@]}" "$@" "$root_dir" >&2 ;;
  podman) podman build --layers -t "$tag" "${secret[@]}" "$@" "$root_dir" >&2 ;;
  buildah) buildah build --layers -t "$tag" "${secret[@]}" "$@" "$root_dir" >&2 ;;
  *) die "IMAGE_BUILDER=$builder: use docker, podman or buildah" ;;
esac

if [ -n "$archive" ]; then
  echo "build-image: writing $archive" >&2
  rm -f "$archive"
  case "$builder" in
    docker) docker save -o "$archive" "$tag" ;;
    *) "$builder" push "$tag" "docker-archive:$archive:$tag" >&2 ;;
  esac
fi
if [ "$push" = 1 ]; then
  echo "build-image: pushing $tag" >&2
  "$builder" push "$tag" >&2
fi
echo "$tag"
