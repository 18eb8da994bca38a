# The node agent image (DaemonSet): tailcut's shaping code plus BCC for the eBPF
# programs. Build from the repository root:
#   docker build -f operator/agent.Dockerfile -t ghcr.io/tailcut/agent:0.1.0 .
# It runs as root with only the capabilities the chart grants (values.yaml says why).
FROM debian:12-slim
RUN apt-get update && apt-get install -y --no-install-recommends \
        python3 python3-venv python3-bpfcc iproute2 && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml README.md ./
COPY tailcut ./tailcut
COPY ebpf ./ebpf
RUN python3 -m venv /venv && /venv/bin/pip install --no-cache-dir '.[k8s]' \
 && ln -s /usr/lib/python3/dist-packages/bcc \
      "$(/venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/bcc"
ENTRYPOINT ["/venv/bin/python", "-m", "tailcut.k8s.agent"]
