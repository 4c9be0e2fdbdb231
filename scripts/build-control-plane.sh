#!/bin/sh
# Builds the real Kubernetes control plane that the local cluster runs: etcd, kube-apiserver,
# kube-controller-manager and kube-scheduler, of the versions pinned by the wrapper Go modules in
# localcluster/controlplane/ (go.mod + go.sum, so the build is reproducible), and fetches kubectl of
# the same version (scripts/install-kubectl.sh, while Go builds: it is the one published as a checked
# binary where these machines reach), into
#   ${RTJ_CACHE_DIR:-~/.cache/rtj}/control-plane-<kubernetes version>-etcd-<etcd version>/bin
# A stamp holding the wrapper modules' digest makes a second run a no-op; Go's module and build
# caches (GOMODCACHE, GOCACHE) make a rebuild after a change cheap.
#
# k8s.io/kubernetes cannot be `go install`ed (its go.mod replaces every staging module k8s.io/* with
# a local path), so the wrapper module requires it and replaces each staging module with the
# published v0.<minor>.<patch>; etcd's server module is a `package main` with local replaces too.
# Flags as upstream's release builds: CGO_ENABLED=0, tags selinux,notest, -trimpath, and the version
# stamped into k8s.io/component-base/version so that the server reports it.
#
# Users who already have these binaries set KUBEBUILDER_ASSETS (as envtest does) or
# RTJ_CONTROL_PLANE_BIN to their folder; then nothing is built.
# Prints the folder of the binaries on its last line.
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
MODULES="$ROOT/localcluster/controlplane"

if [ -n "${RTJ_CONTROL_PLANE_BIN:-${KUBEBUILDER_ASSETS:-}}" ]; then
    echo "${RTJ_CONTROL_PLANE_BIN:-$KUBEBUILDER_ASSETS}"
    exit 0
fi
command -v go >/dev/null || {
    echo "build-control-plane.sh: the Go toolchain (1.26) is needed to build the control plane;" >&2
    echo "  or point KUBEBUILDER_ASSETS at a folder with etcd, kube-apiserver, kube-controller-manager," >&2
    echo "  kube-scheduler and kubectl of one Kubernetes version" >&2
    exit 1
}

version_of() { # module path, go.mod -> the version it requires
    awk -v m="$1" '$1 == "require" && $2 == m { print $3 } $1 == m && $2 ~ /^v/ { print $2 }' "$2" | head -n 1
}
K8S_VERSION=$(version_of k8s.io/kubernetes "$MODULES/kubernetes/go.mod")
ETCD_VERSION=$(version_of go.etcd.io/etcd/server/v3 "$MODULES/etcd/go.mod")
[ -n "$K8S_VERSION" ] && [ -n "$ETCD_VERSION" ] || { echo "build-control-plane.sh: no pinned versions found" >&2; exit 1; }

CACHE=${RTJ_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rtj}
DEST="$CACHE/control-plane-$K8S_VERSION-etcd-$ETCD_VERSION"
DIGEST=$(cat "$MODULES"/kubernetes/go.* "$MODULES"/etcd/go.* "$0" "$ROOT/scripts/install-kubectl.sh" "$ROOT/scripts/fetch-npm-binary.sh" | sha256sum | cut -d' ' -f1)
if [ -f "$DEST/stamp" ] && [ "$(cat "$DEST/stamp")" = "$DIGEST" ]; then
    echo "$DEST/bin"
    exit 0
fi

mkdir -p "$DEST/bin"
started=$(date +%s)
MINOR=$(echo "$K8S_VERSION" | cut -d. -f2)
LDFLAGS="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$MINOR -X k8s.io/component-base/version.gitTreeState=clean"
echo "build-control-plane.sh: building Kubernetes $K8S_VERSION and etcd $ETCD_VERSION into $DEST/bin (a first build takes 10-30 minutes)" >&2
"$ROOT/scripts/install-kubectl.sh" "$DEST/bin/kubectl" "$K8S_VERSION" &
KUBECTL_FETCH=$!
(
    cd "$MODULES/kubernetes"
    CGO_ENABLED=0 GOFLAGS=-mod=readonly go build -trimpath -tags selinux,notest -ldflags "$LDFLAGS" \
        -o "$DEST/bin/" \
        k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
        k8s.io/kubernetes/cmd/kube-scheduler
)
(
    cd "$MODULES/etcd"
    CGO_ENABLED=0 GOFLAGS=-mod=readonly go build -trimpath -ldflags "-s -w" -o "$DEST/bin/etcd" go.etcd.io/etcd/server/v3
)
wait "$KUBECTL_FETCH" || { echo "build-control-plane.sh: kubectl could not be installed" >&2; exit 1; }
echo "$DIGEST" >"$DEST/stamp"
echo "build-control-plane.sh: built in $(($(date +%s) - started)) s" >&2
echo "$DEST/bin"
