# The worker image with PyTorch: what the pods of jobs with a torch model or
# `syncMode: allreduce` run (the chart's workers.torchImage; the operator picks it for
# those jobs only). Built on request, `tailcut images build --torch`, since it adds
# about 650 MiB. Build from the repository root:
#   docker build -f workers/torch.Dockerfile -t ghcr.io/tailcut/worker-torch:0.1.0 .
# Every step is workers/Dockerfile's, character for character
# (tests/k8s/test_images.py checks it), with PyTorch's step before the code.
ARG BASE=debian:12-slim
# The datagram paths' compiled steps (tailcut/transports/rxfast.c, txfast.c), built in a stage of
# their own so that the image carries the library and no compiler.
FROM ${BASE} AS rxfast
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/*
COPY tailcut/transports/rxfast.c tailcut/transports/txfast.c ebpf/partial.h /src/
RUN cc -O2 -shared -fPIC -Wall -I/src -o /src/rxfast.so /src/rxfast.c /src/txfast.c
FROM ${BASE}
# BCC (Debian's python3-bpfcc, linked into the venv): bounded-loss receivers compile
# and attach the XDP counter in their own pod (the chart's workers.xdp says why).
# iproute2 and nftables are the agent's.
RUN apt-get update && apt-get install -y --no-install-recommends \
        python3 python3-venv python3-bpfcc iproute2 nftables \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/*
# A venv: Debian's own python3 refuses system-wide pip installs (PEP 668). No
# matplotlib: plots are drawn where the results are collected, never in a pod.
COPY pyproject.toml scripts/image-requirements.py /tmp/deps/
RUN python3 /tmp/deps/image-requirements.py /tmp/deps/pyproject.toml \
      --without matplotlib --without locust > /tmp/deps/core.txt \
 && python3 -m venv /venv && /venv/bin/pip install --no-cache-dir -r /tmp/deps/core.txt \
 && ln -s /usr/lib/python3/dist-packages/bcc \
      "$(/venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/bcc"
# Locust: background-load pods run it.
RUN python3 /tmp/deps/image-requirements.py /tmp/deps/pyproject.toml --only locust \
      > /tmp/deps/locust.txt \
 && /venv/bin/pip install --no-cache-dir -r /tmp/deps/locust.txt && rm -rf /tmp/deps
# PyTorch for torch models and DDP/Gloo jobs (docs/pytorch.md): Debian's CPU-only
# build with OpenBLAS (without it the reference BLAS makes a torch-mlp step 6x
# slower), linked into the venv as bcc is. Its own layer after the worker's, so the
# two images share everything below it on a node, and a change to the code rebuilds
# neither this nor them.
RUN apt-get update && apt-get install -y --no-install-recommends \
        python3-torch libopenblas0-pthread \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/* \
 && ln -s /usr/lib/python3/dist-packages/torch \
      "$(/venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/torch"
# The settings before the code: each step is a layer of its own, and those after the
# code are redone whenever it changes.
ENV PATH=/venv/bin:$PATH PYTHONPATH=/app OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1 \
    TAILCUT_RESULTS_DIR=/tmp TAILCUT_RXFAST_LIB=/usr/local/lib/tailcut/rxfast.so
WORKDIR /app
ENTRYPOINT ["python", "/app/workers/entrypoint.py"]
COPY --from=rxfast /src/rxfast.so /usr/local/lib/tailcut/rxfast.so
# tailcut's code, imported from /app; the BPF programs and their headers where an
# installed package keeps them (tailcut/ebpf/). Compiled here: uid 65532 cannot write
# __pycache__ under /app and would compile every module on every start.
COPY tailcut /app/tailcut
COPY ebpf /app/tailcut/ebpf
COPY workers/entrypoint.py /app/workers/entrypoint.py
RUN python -m compileall -q /app
USER 65532:65532
