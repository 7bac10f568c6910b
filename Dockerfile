# syntax=docker/dockerfile:1
# The dra-gpu image: the `dra-gpu` command (node agent and cluster controller) and the limiter library.
#
#   make image        (tools/build-image.sh: docker, podman or buildah, whichever is installed)
#
# Plain Debian images only, no CUDA image: the limiter builds against the project's own CUDA
# declarations. It is LD_PRELOADed into workload containers of every distribution, so it is built on an
# old glibc (Debian 11: 2.31, as Ubuntu 20.04) and links nothing but the C library. NVML, nvidia-smi and
# the MPS binaries are not in the image: the node agent runs the host driver's, from the host's root
# that the DaemonSet mounts at /driver-root (NVIDIA_VISIBLE_DEVICES=void: no runtime hook injects them).
# Where no registry is reachable, tools/base-images.sh produces both base images locally.

ARG BUILD_IMAGE=debian:bullseye-slim
ARG RUNTIME_IMAGE=debian:bookworm-slim

FROM ${BUILD_IMAGE} AS limiter
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends make gcc libc6-dev \
    && apt-get clean && rm -rf /var/lib/apt/lists/*
WORKDIR /src/native/limiter
COPY native/limiter/ ./
# The release the library says it belongs to (native/limiter/Makefile reads it from here).
COPY src/dra_gpu/__init__.py /src/src/dra_gpu/__init__.py
# Only the library: the fakes and the probe are for tests.
RUN make build/libdragpu-limiter.so.1 \
    && install -D -m 0755 "$(readlink -f build/libdragpu-limiter.so.1)" /out/libdragpu-limiter.so.1

# What the node agent runs besides the driver's tools: python3; `unshare` and `mount` (util-linux,
# mount) put each MPS control daemon in a mount namespace of its own; the init container runs `sh`,
# `cp` and `mv`.
FROM ${RUNTIME_IMAGE} AS runtime
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3 mount util-linux \
    && apt-get clean && rm -rf /var/lib/apt/lists/*

FROM runtime AS python
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3-venv \
    && apt-get clean && rm -rf /var/lib/apt/lists/*
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# Dependencies first, in a layer of their own: a change to the sources reinstalls only the project. They
# come from requirements.lock, each pinned with the sha256 of its wheels (a changed file on the index
# fails the build), wheels only (nothing compiles at build time), and `pip check` proves the lock whole.
# The build secret `pip-ca`, when given, is the certificate bundle the downloads trust (a proxy with its
# own authority; tools/build-image.sh passes the build machine's); it is not kept in the image.
RUN python3 -m venv /opt/dra-gpu
WORKDIR /src
COPY requirements.lock ./
RUN --mount=type=secret,id=pip-ca \
    if [ -s /run/secrets/pip-ca ]; then export PIP_CERT=/run/secrets/pip-ca; fi \
    && /opt/dra-gpu/bin/pip install --quiet --require-hashes --no-deps --only-binary=:all: -r requirements.lock
COPY pyproject.toml README.md ./
COPY src/ src/
RUN --mount=type=secret,id=pip-ca \
    if [ -s /run/secrets/pip-ca ]; then export PIP_CERT=/run/secrets/pip-ca; fi \
    && /opt/dra-gpu/bin/pip install --quiet --no-deps --no-build-isolation . \
    && /opt/dra-gpu/bin/pip check \
    && /opt/dra-gpu/bin/dra-gpu --version
# Out of the image: the installer (nothing installs at run time) and the kubernetes client's asyncio
# variant (68 MB; only its synchronous transport and configuration are used).
RUN rm -rf /opt/dra-gpu/lib/python3*/site-packages/kubernetes/aio \
    && /opt/dra-gpu/bin/python -m pip uninstall --quiet -y pip setuptools wheel packaging \
    && /opt/dra-gpu/bin/python -c 'import dra_gpu.kube.client, kubernetes.client, kubernetes.config' 

FROM runtime
COPY --from=python /opt/dra-gpu /opt/dra-gpu
# The DaemonSet's init container copies this file to a versioned file in the node's state directory.
COPY --from=limiter /out/libdragpu-limiter.so.1 /usr/lib/dra-gpu/libdragpu-limiter.so.1
ENV PATH=/opt/dra-gpu/bin:$PATH PYTHONUNBUFFERED=1
RUN for tool in dra-gpu sh cp mv unshare mount; do \
        command -v "$tool" >/dev/null || { echo "the image lacks $tool" >&2; exit 1; }; \
    done
# The software bill of materials (CycloneDX JSON) of what the image holds: its Debian packages and the
# Python packages of /opt/dra-gpu, written at build from the installed files themselves.
COPY tools/sbom.py /usr/share/dra-gpu/sbom.py
RUN /opt/dra-gpu/bin/python /usr/share/dra-gpu/sbom.py > /usr/share/dra-gpu/sbom.cdx.json
# Not root unless a pod says so: the controller runs as this user; the node agent and its init container
# ask for root (runAsUser: 0) because the host directories they write belong to root.
USER 65532:65532
ENTRYPOINT ["dra-gpu"]
CMD ["--help"]
