#!/usr/bin/env bash
# Set up this machine for tailcut: Debian packages (BCC, kernel headers, tools),
# the header links BCC needs on kernels without /lib/modules/<ver>/build, and a
# virtual environment in .venv with tailcut, its dependencies and Debian's bcc.
# Safe to run twice: every step checks before it acts.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"

if [ "$(id -u)" != 0 ]; then
  echo "setup.sh: run as root (it installs Debian packages and tailcut needs root to build namespaces)" >&2
  exit 1
fi

apt_packages=(python3-bpfcc bpfcc-tools linux-headers-amd64 bpftool iproute2 tcpdump
  # the single-node Kubernetes cluster of the `cluster` tests (tailcut cluster up):
  # container runtime, CNI plugins, kube-proxy's and the kubelet's packet filters,
  # and what builds the images without Docker (a Debian base, the Dockerfiles)
  containerd runc containernetworking-plugins iptables nftables conntrack
  mmdebstrap buildah)
missing=()
for p in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# BCC compiles against /lib/modules/$(uname -r)/{build,source}. Kernels without
# packaged headers (this VM's 6.18) have neither: point them at Debian's newest
# headers. XDP and tc programs use only stable UAPI, so a version mismatch is harmless.
kdir=/lib/modules/$(uname -r)
if [ ! -e "$kdir/build" ]; then
  arch_hdr=$(ls -d /usr/src/linux-headers-*-amd64 2>/dev/null | sort -V | tail -n 1)
  common_hdr=$(ls -d /usr/src/linux-headers-*-common 2>/dev/null | sort -V | tail -n 1)
  if [ -z "$arch_hdr" ] || [ -z "$common_hdr" ]; then
    echo "setup: no kernel headers under /usr/src after installing linux-headers-amd64" >&2
    exit 1
  fi
  mkdir -p "$kdir"
  ln -sfn "$arch_hdr" "$kdir/build"
  ln -sfn "$common_hdr" "$kdir/source"
  echo "setup: linked $kdir/build -> $arch_hdr"
fi

py=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$py" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -e '.[dev]'

# Debian ships bcc for /usr/bin/python3 only; link just that package into the venv
# rather than exposing all of Debian's dist-packages.
site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
ln -sfn /usr/lib/python3/dist-packages/bcc "$site/bcc"
.venv/bin/python -c 'import bcc' || { echo "setup: bcc does not import in .venv" >&2; exit 1; }
# PyTorch, for torch models and the allreduce (DDP/Gloo) baseline: Debian's CPU-only
# build, chosen by measurement (docs/pytorch.md: 151 MB to download, no GPU
# libraries), linked into the venv as bcc is. TAILCUT_TORCH=0 skips it; tailcut then
# refuses torch jobs, naming this step.
if [ "${TAILCUT_TORCH:-1}" != 0 ]; then
  # libopenblas0-pthread: without it Debian's torch multiplies with the reference
  # BLAS, and a torch-mlp step takes 12 ms instead of 2 (docs/pytorch.md).
  torch_missing=()
  for p in python3-torch libopenblas0-pthread; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || torch_missing+=("$p")
  done
  if [ ${#torch_missing[@]} -gt 0 ]; then
    echo "setup: installing ${torch_missing[*]} (CPU-only, without recommends)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      "${torch_missing[@]}" >/dev/null
  fi
  ln -sfn /usr/lib/python3/dist-packages/torch "$site/torch"
  .venv/bin/python -c 'from tailcut.ml import torchmodel; torchmodel.require()' \
    || { echo "setup: torch does not import in .venv" >&2; exit 1; }
fi
# The k8s tests' control plane: kube-apiserver and helm built with Go, cached in
# ~/.cache/tailcut (minutes on a cold cache, nothing on a warm one).
"$here/scripts/k8s-tools.sh" >/dev/null
echo "setup: ready (.venv)"
