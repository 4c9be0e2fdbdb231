#!/usr/bin/env bash
# Copy the generated CRDs (crds/) into the Helm chart's crds/ folder, which Helm installs before
# the chart's templates. tests/chart keeps the two copies identical.
set -euo pipefail
cd "$(dirname "$0")/.."
chart_crds=charts/resilient-training-operator/crds
mkdir -p "$chart_crds"
rm -f "$chart_crds"/*.yaml
cp crds/*.yaml "$chart_crds"/
