# The node agent image (DaemonSet): tailcut's shaping code plus BCC for the eBPF
# programs. Build from the repository root:
#   docker build -f operator/agent.Dockerfile -t ghcr.io/tailcut/agent:0.1.0 .
# It runs as root with only the capabilities the chart grants (values.yaml says why).
# nftables: the guard that accepts a job's VXLAN only from its nodes (tailcut.net.overlay).
# BASE is Debian 12 (BCC comes from Debian's python3-bpfcc); `tailcut images build`
# uses a locally made one.
ARG BASE=debian:12-slim
FROM ${BASE}
RUN apt-get update && apt-get install -y --no-install-recommends \
        python3 python3-venv python3-bpfcc iproute2 nftables && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml setup.py README.md ./
COPY tailcut ./tailcut
# The BPF programs: pip installs them into the package as tailcut/ebpf/.
COPY ebpf ./ebpf
RUN python3 -m venv /venv && /venv/bin/pip install --no-cache-dir '.[k8s]' \
 && ln -s /usr/lib/python3/dist-packages/bcc \
      "$(/venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/bcc" \
 && rm -rf /app/tailcut /app/ebpf
ENV PATH=/venv/bin:$PATH PYTHONUNBUFFERED=1
ENTRYPOINT ["python", "-m", "tailcut.k8s.agent"]
