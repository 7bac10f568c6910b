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
#   --runtime       only print the OCI runtime the build's RUN steps would use ("default": the builder's)
# IMAGE_RUNTIME=runc|crun|... picks the runtime of podman's and buildah's RUN steps. Without it, where
# /sys/fs/cgroup is not cgroup v2 alone (v1, or hybrid, which crun refuses: "cgroups in hybrid mode
# not supported") and runc is installed, runc runs them, as it does the container tests.
# Prints the image reference on stdout; the builder's output goes to stderr.
set -euo pipefail

root_dir="$(cd "$(dirname "$0")/.." && pwd)"
die() { echo "build-image: $*" >&2; exit 2; }

values=() tag="" push=0 archive="" which=0 which_runtime=0
while [ "$#" -gt 0 ]; do
  case "$1" in
    --values) [ "$#" -ge 2 ] || die "--values needs a file"; values=(--values "$2"); shift 2 ;;
    --tag) [ "$#" -ge 2 ] || die "--tag needs an image reference"; tag=$2; shift 2 ;;
    --push) push=1; shift ;;
    --builder) which=1; shift ;;
    --runtime) which_runtime=1; shift ;;
    --archive) [ "$#" -ge 2 ] || die "--archive needs a file"; archive=$2; shift 2 ;;
    --) shift; break ;;
    *) die "unknown argument $1 (see the usage at the top of $0)" ;;
  esac
done

if [ "$which" = 0 ] && [ "$which_runtime" = 0 ] && [ -z "$tag" ]; then
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

runtime=${IMAGE_RUNTIME:-}
if [ -z "$runtime" ] && [ "$builder" != docker ] &&
   [ "$(stat -fc %T /sys/fs/cgroup 2>/dev/null)" != cgroup2fs ] && command -v runc >/dev/null; then
  runtime=runc
fi
if [ "$which_runtime" = 1 ]; then echo "${runtime:-default}"; exit 0; fi
runtime_flag=()
if [ -n "$runtime" ]; then
  [ "$builder" != docker ] || die "IMAGE_RUNTIME applies to podman and buildah; docker's daemon picks its own"
  runtime_flag=(--runtime "$runtime")
fi

# The certificate authorities the build's Python package downloads trust (see the Dockerfile): pip's
# own setting, else this machine's trust store, so that a build behind a proxy with its own authority
# works wherever pip on this machine does. A build secret: not stored in the image.
secret=()
for ca in "${PIP_CERT:-}" "${REQUESTS_CA_BUNDLE:-}" "${SSL_CERT_FILE:-}" /etc/ssl/certs/ca-certificates.crt; do
  if [ -n "$ca" ] && [ -s "$ca" ]; then secret=(--secret "id=pip-ca,src=$ca"); break; fi
done

echo "build-image: building $tag with $builder${runtime:+ (runtime $runtime)}" >&2
case "$builder" in
  docker) DOCKER_BUILDKIT=1 docker build -t "$tag" "${secret[@]}" "$@" "$root_dir" >&2 ;;
  podman) podman build --layers "${runtime_flag[@]}" -t "$tag" "${secret[@]}" "$@" "$root_dir" >&2 ;;
  buildah) buildah build --layers "${runtime_flag[@]}" -t "$tag" "${secret[@]}" "$@" "$root_dir" >&2 ;;
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
