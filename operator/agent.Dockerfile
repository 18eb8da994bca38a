# The node agent image (DaemonSet): tailcut's shaping code plus BCC for the eBPF
# programs. Build from the repository root:
#   docker build -f operator/agent.Dockerfile -t ghcr.io/tailcut/agent:0.1.0 .
# It runs as root with only the capabilities the chart grants (values.yaml says why).
# nftables: the guard that accepts a job's VXLAN only from its nodes (tailcut.net.overlay).
# BASE is Debian 12 (BCC comes from Debian's python3-bpfcc); `tailcut images build`
# uses a locally made one. The layers: see workers/Dockerfile, whose first three steps
# these are, character for character.
ARG BASE=debian:12-slim
FROM ${BASE}
RUN apt-get update && apt-get install -y --no-install-recommends \
        python3 python3-venv python3-bpfcc iproute2 nftables \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/*
COPY pyproject.toml scripts/image-requirements.py /tmp/deps/
RUN python3 /tmp/deps/image-requirements.py /tmp/deps/pyproject.toml \
      --without matplotlib --without locust > /tmp/deps/core.txt \
 && python3 -m venv /venv && /venv/bin/pip install --no-cache-dir -r /tmp/deps/core.txt \
 && ln -s /usr/lib/python3/dist-packages/bcc \
      "$(/venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/bcc"
# kopf, the Kubernetes client (less its asyncio copy, kubernetes/aio, 68 MB, which
# nothing imports), prometheus-client. No matplotlib or Locust: the agent neither
# plots nor makes background load.
RUN python3 /tmp/deps/image-requirements.py /tmp/deps/pyproject.toml --extra k8s \
      --extras-only > /tmp/deps/k8s.txt \
 && /venv/bin/pip install --no-cache-dir -r /tmp/deps/k8s.txt && rm -rf /tmp/deps \
 && rm -rf "$(/venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/kubernetes/aio"
ENV PATH=/venv/bin:$PATH PYTHONPATH=/app PYTHONUNBUFFERED=1
WORKDIR /app
ENTRYPOINT ["python", "-m", "tailcut.k8s.agent"]
COPY tailcut /app/tailcut
COPY ebpf /app/tailcut/ebpf
RUN python -m compileall -q /app
