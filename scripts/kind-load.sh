#!/usr/bin/env bash
# For machines with Docker: build tailcut's three images with `docker build` from
# their Dockerfiles and load them into a kind cluster's nodes, as docs/kubernetes.md
# describes. (Without Docker, `tailcut cluster up` builds the same Dockerfiles with
# buildah and loads them into its own node.)
#
#   scripts/kind-load.sh [CLUSTER]      default cluster name: tailcut
set -euo pipefail
cluster=${1:-tailcut}
cd "$(dirname "$0")/.."
tag=0.1.0
for pair in operator:operator/Dockerfile agent:operator/agent.Dockerfile worker:workers/Dockerfile; do
  name=${pair%%:*} dockerfile=${pair#*:}
  docker build -f "$dockerfile" -t "ghcr.io/tailcut/$name:$tag" .
  kind load docker-image --name "$cluster" "ghcr.io/tailcut/$name:$tag"
done
