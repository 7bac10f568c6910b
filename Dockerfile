# syntax=docker/dockerfile:1
# The dra-gpu image: the `dra-gpu` command (node agent and cluster controller) and the limiter library.
#
#   docker build -t dra-gpu:0.1.0 .
#
# The limiter is LD_PRELOADed into workload containers of every distribution, so it is built against an
# old glibc (Ubuntu 20.04: 2.31) and links nothing but the C library. NVML, nvidia-smi and the MPS
# binaries are not in the image: on GPU nodes the NVIDIA container toolkit injects the host driver's.

ARG CUDA_DEVEL_IMAGE=nvidia/cuda:12.4.1-devel-ubuntu20.04
ARG PYTHON_IMAGE=python:3.12-slim-bookworm

FROM ${CUDA_DEVEL_IMAGE} AS limiter
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends make gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src/native/limiter
COPY native/limiter/ ./
# Only the library: the fakes and the probe are for tests.
RUN make CUDA_INCLUDE=/usr/local/cuda/include build/libdragpu-limiter.so.1 \
    && install -D -m 0755 "$(readlink -f build/libdragpu-limiter.so.1)" /out/libdragpu-limiter.so.1

FROM ${PYTHON_IMAGE} AS python
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/dra-gpu
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src/ src/
RUN /opt/dra-gpu/bin/pip install . \
    && /opt/dra-gpu/bin/dra-gpu --version

FROM ${PYTHON_IMAGE}
COPY --from=python /opt/dra-gpu /opt/dra-gpu
# The DaemonSet's init container copies this file to a versioned file in the node's state directory.
COPY --from=limiter /out/libdragpu-limiter.so.1 /usr/lib/dra-gpu/libdragpu-limiter.so.1
ENV PATH=/opt/dra-gpu/bin:$PATH PYTHONUNBUFFERED=1
# What the node agent runs besides the driver's tools: `unshare` and `mount` (util-linux) put each MPS
# control daemon in a mount namespace of its own, and the init container runs `sh`, `cp` and `mv`.
RUN for tool in sh cp mv unshare mount; do \
        command -v "$tool" >/dev/null || { echo "the image lacks $tool" >&2; exit 1; }; \
    done
ENTRYPOINT ["dra-gpu"]
CMD ["--help"]
