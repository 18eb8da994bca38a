#!/usr/bin/env bash
# For machines with Docker: a kind cluster that tailcut runs on as written in
# docs/kubernetes.md ("Installing on kind"), then tailcut's images and chart in it.
#
#   scripts/kind-up.sh [CLUSTER]       default cluster name: tailcut
#
# What kind's defaults lack, and what this does about it:
# - kind's Docker network has MTU 1500; a job's racks on two nodes are joined by VXLAN,
#   which adds 50 bytes to the job's MTU (1500 by default): the network is made with
#   MTU 1550 first (kind uses an existing network called "kind"), or a job across
#   nodes fails at once (NodeUnfit, naming spec.network.mtu). Set KIND_MTU to change it (a job with spec.network.mtu M needs M + 50).
# - kind's nodes do not mount the host's /usr/src, where /lib/modules/<version>/build
#   points: without it BCC finds no kernel headers (the agent's eBPF dropper, a
#   bounded-loss pod's XDP counter), and a bounded-loss job fails at once saying so.
#   Both are mounted read-only into every node.
# - background load needs native sidecars: Kubernetes >= 1.29 (checked after creation).
# - the agent needs Pod Security's privileged level in its namespace: the namespace is
#   created and labelled before `helm install` (helm cannot label its own namespace).
set -euo pipefail
cluster=${1:-tailcut}
mtu=${KIND_MTU:-1550}
ns=tailcut-system
cd "$(dirname "$0")/.."
config=$(mktemp --suffix=.yaml)
trap 'rm -f "$config"' EXIT
mounts='    extraMounts:
      - {hostPath: /lib/modules, containerPath: /lib/modules, readOnly: true}
      - {hostPath: /usr/src, containerPath: /usr/src, readOnly: true}'
{
  echo "kind: Cluster"
  echo "apiVersion: kind.x-k8s.io/v1alpha4"
  echo "nodes:"
  for role in control-plane worker worker; do
    echo "  - role: $role"
    echo "$mounts"
  done
} > "$config"
if ! docker network inspect kind >/dev/null 2>&1; then
  docker network create kind --opt "com.docker.network.driver.mtu=$mtu"
else
  have=$(docker network inspect kind -f '{{index .Options "com.docker.network.driver.mtu"}}')
  [ "${have:-1500}" -ge "$mtu" ] || echo "warning: Docker network 'kind' has MTU ${have:-1500}" \
    "< $mtu: cross-node jobs will fail (NodeUnfit; delete it with no cluster on it, and rerun)" >&2
fi
kind create cluster --name "$cluster" --config "$config"
minor=$(kubectl version -o json | python3 -c 'import json,sys; print(int(json.load(sys.stdin)["serverVersion"]["minor"].rstrip("+")))')
[ "$minor" -ge 29 ] || { echo "Kubernetes 1.$minor: tailcut needs 1.29 or later" \
  "(native sidecars); pass a newer node image, e.g. kind create cluster --image" \
  "kindest/node:v1.29.2" >&2; exit 1; }
scripts/kind-load.sh "$cluster"
kubectl create namespace "$ns" --dry-run=client -o yaml | kubectl apply -f -
kubectl label namespace "$ns" pod-security.kubernetes.io/enforce=privileged --overwrite
helm install tailcut helm/tailcut --namespace "$ns" --wait --timeout 5m
helm test tailcut --namespace "$ns"
echo "tailcut is installed; \`pip install 'tailcut[k8s]'\` (or '.[k8s]' here) for tailcut collect"
