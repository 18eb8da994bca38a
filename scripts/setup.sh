#!/usr/bin/env bash
# Set up this machine for tailcut. Safe to run twice: every step checks before it acts.
#
#   scripts/setup.sh            what `tailcut run` needs: Debian's BCC, kernel headers
#                               (and the links BCC needs on kernels without
#                               /lib/modules/<ver>/build), tools, and .venv with
#                               tailcut and Debian's bcc linked in (a minute or two)
#   scripts/setup.sh --cluster  also what `tailcut cluster up` and `tailcut images
#                               build` need: containerd, runc, the CNI plugins, packet
#                               filters, buildah, and the Kubernetes binaries built with
#                               Go (scripts/k8s-tools.sh: ~10 min once, then nothing)
#   scripts/setup.sh --torch    also PyTorch (Debian's CPU-only python3-torch, 151 MB):
#                               torch models and the allreduce (DDP/Gloo) baseline
#   scripts/setup.sh --tests    --cluster, --torch and the test tools (pytest, etcd,
#                               mypy) in .venv
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"

cluster=0 tests=0 torch=0
for arg in "$@"; do
  case $arg in
    --cluster) cluster=1 ;;
    --torch) torch=1 ;;
    --tests) cluster=1 tests=1 torch=1 ;;
    *) echo "setup.sh: unknown option $arg (--cluster, --torch or --tests)" >&2; exit 2 ;;
  esac
done

if [ "$(id -u)" != 0 ]; then
  echo "setup.sh: run as root (it installs Debian packages and tailcut needs root to build namespaces)" >&2
  exit 1
fi

# Installs those of the named Debian packages that are missing.
apt_install() {
  local missing=() p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "setup: installing ${missing[*]}"
  if [ -z "${apt_updated:-}" ]; then apt-get update -qq; apt_updated=1; fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
}

# The venv first (Debian's python3 needs python3-venv for it), so that pip downloads and
# installs tailcut's dependencies while apt installs the rest: on a fresh machine the
# two take about as long as each other, and neither needs the other's packages.
apt_install python3-venv
py=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$py" -m venv .venv
fi
extra=""                            # tailcut run: the package and its dependencies
[ $cluster = 1 ] && extra="[cluster]"   # etcd for tailcut cluster up
[ $tests = 1 ] && extra="[dev]"         # pytest, mypy, kopf, the cluster's etcd, ...
# Skipped when .venv already holds this pyproject.toml's packages with these extras or
# more (a stamp names them): a second run then costs nothing here.
hash=$(cat pyproject.toml setup.py | sha256sum | cut -c1-16)
case $extra in
  "") enough=("" cluster dev) ;;
  "[cluster]") enough=(cluster dev) ;;
  *) enough=(dev) ;;
esac
done_before=0
for e in "${enough[@]}"; do [ -e ".venv/.setup-$hash-$e" ] && done_before=1; done
if [ $done_before = 1 ]; then
  true &
else
  name=${extra#[}; name=${name%]}
  (.venv/bin/python -m pip install -q --disable-pip-version-check -e ".$extra" \
     && find .venv -maxdepth 1 -name '.setup-*' ! -name ".setup-$hash-*" -delete \
     && touch ".venv/.setup-$hash-$name") &
fi
pip_pid=$!
trap '[ -z "$pip_pid" ] || kill "$pip_pid" 2>/dev/null || true' EXIT   # apt failed: stop it

# gcc: the bounded-loss receive path's compiled steps (tailcut/transports/rxfast.c)
apt_install python3-bpfcc bpfcc-tools linux-headers-amd64 bpftool iproute2 tcpdump gcc
if [ $cluster = 1 ]; then
  # the Kubernetes cluster on this host (tailcut cluster up): container runtime, CNI
  # plugins, kube-proxy's and the kubelet's packet filters, the overlay's nftables
  # guard, gcc for the pause program, and what builds the images without Docker
  apt_install containerd runc containernetworking-plugins iptables nftables conntrack gcc \
    mmdebstrap buildah
fi
# tests/uml: Debian's user-mode Linux (a 6.1 kernel with netem, run as a process; kmod's modprobe loads its modules)
if [ $tests = 1 ]; then apt_install user-mode-linux kmod; fi

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

status=0; wait "$pip_pid" || status=$?
pip_pid=""
if [ $status != 0 ]; then
  echo "setup: pip install -e '.$extra' into .venv failed (its messages are above)" >&2
  exit 1
fi

# Debian ships bcc for /usr/bin/python3 only; link just that package into the venv
# rather than exposing all of Debian's dist-packages.
site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
ln -sfn /usr/lib/python3/dist-packages/bcc "$site/bcc"
.venv/bin/python -c 'import bcc' || { echo "setup: bcc does not import in .venv" >&2; exit 1; }
# Compiled once here rather than in a job's first run; it prints which receive path
# bounded-loss jobs will use (numpy, and why, if the C one cannot be built).
.venv/bin/python -m tailcut.transports.rxfast
# PyTorch, for torch models and the allreduce (DDP/Gloo) baseline: Debian's CPU-only
# build, chosen by measurement (docs/pytorch.md: 151 MB to download, no GPU
# libraries), linked into the venv as bcc is. Without it tailcut refuses torch jobs,
# naming this step; the quickstart does not need it.
if [ $torch = 1 ]; then
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
if [ $cluster = 1 ]; then
  # kube-apiserver, helm, the kubelet, ... built with Go, cached in ~/.cache/tailcut
  # (minutes on a cold cache, nothing on a warm one; it prints what it builds).
  "$here/scripts/k8s-tools.sh" >/dev/null
fi
echo "setup: ready (.venv)"
