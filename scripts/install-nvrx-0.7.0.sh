#!/usr/bin/env bash
# Puts NVRx 0.7.0, the trainer image's release, into a directory that the trainer tests put on
# PYTHONPATH (`make test` runs tests/trainer once on .venv's NVRx 0.4.1 and once on this).
#
#   scripts/install-nvrx-0.7.0.sh <directory> [<python>]      (default python: .venv/bin/python)
#
# 0.7.0 cannot be installed into the Python 3.11 environment: its only wheel is cp312
# manylinux_2_39. Its modules are pure Python apart from one CUPTI extension (nvrx_cupti_module,
# the straggler detector's kernel timing, which the trainer does not use), so pip is told the
# wheel's own platform and installs it into the directory; the extension is removed, since a
# Python 3.11 interpreter would never load it. The dependencies .venv lacks are installed next to it
# for this interpreter. Everything is verified by hash (scripts/nvrx-0.7.0-*.txt), and the directory
# only appears, whole, once 0.7.0 imports from it.
set -euo pipefail

target=${1:?usage: $0 <directory> [<python>]}
python=${2:-.venv/bin/python}
here=$(cd "$(dirname "$0")" && pwd)
staging="${target}.partial"

rm -rf "$staging"
mkdir -p "$staging"

pip_install=("$python" -m pip install --quiet --disable-pip-version-check --no-deps
             --require-hashes --only-binary=:all: --target "$staging")
"${pip_install[@]}" -r "$here/nvrx-0.7.0-deps.txt"
# Console scripts written for this interpreter's packages are not needed (nothing runs them), and
# the wheel's own would be written for another interpreter.
rm -rf "$staging/bin"
"${pip_install[@]}" --python-version 3.12 --implementation cp --abi cp312 \
    --platform manylinux_2_39_x86_64 -r "$here/nvrx-0.7.0-wheel.txt"

# The console scripts (.venv's ft_launcher imports whichever NVRx comes first on the path) and the
# extension built for 3.12 only.
rm -rf "$staging/bin"
find "$staging" -maxdepth 1 -name 'nvrx_cupti_module*.so' -delete

# The modules the trainer imports, with 0.7.0 found ahead of .venv's 0.4.1.
PYTHONPATH="$staging" STAGING="$staging" "$python" -W ignore::FutureWarning - <<'PY'
import os
from importlib import metadata

import nvidia_resiliency_ext
from nvidia_resiliency_ext import inprocess
from nvidia_resiliency_ext.checkpointing.async_ckpt import core, torch_ckpt
from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient, launcher

staging = os.path.abspath(os.environ["STAGING"])
version = metadata.version("nvidia-resiliency-ext")
assert version == "0.7.0", f"found NVRx {version}, not 0.7.0"
for module in (inprocess, core, torch_ckpt, launcher):
    assert module.__file__ is not None and module.__file__.startswith(staging), module.__file__
assert callable(RankMonitorClient)
print(f"NVRx {version}: {nvidia_resiliency_ext.__file__}")
PY

rm -rf "$target"
mv "$staging" "$target"
touch "$target/.installed"
