#!/usr/bin/env bash
# Fill .whl/ with what tools/gpu/check.sh installs on the offline GPU machine (Python 3.12), and
# say how much that is (the device tool carries 64 MiB in all, the working tree included).
#
#   tools/gpu/fetch_wheels.sh [PYTHON3.12]
#
# - PyCUDA: its cp312 wheel, built here by build_pycuda_wheel.sh when a Python 3.12 is given
#   (pyenv's, say); its source distribution in any case, which check.sh builds on the GPU
#   machine (against its own toolkit; setuptools, wheel and numpy are there) when no wheel fits.
# - The pure-Python packages that the tests, `python -m engine bench` and PyCUDA import and the
#   GPU machine lacks (its packages: /work/.library/device/KINDS.md), at the versions of the
#   project's venv, and siphash24's cp312 wheel (pytools needs it). numpy, jinja2, tokenizers,
#   pyyaml, requests, tqdm, psutil, pytest, pytest-timeout and cuda-bindings are there already.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
out=$repo/.whl
mkdir -p "$out"
pip=(python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$out")
"${pip[@]}" gguf==0.19.0 platformdirs==4.14.9 keyring==25.7.0 jaraco.classes==3.4.0 jaraco.context==6.1.2 \
    jaraco.functools==4.6.0 more-itertools==11.2.1 jeepney==0.9.0 pytools==2026.1.1 siphash24==1.9 mako==1.4.3
if [ -n "${1:-}" ]; then
    "$repo/tools/gpu/build_pycuda_wheel.sh" "$1"
elif [ ! -f "$out/pycuda-2026.1.tar.gz" ]; then
    python3 -m pip download -q --no-deps --no-binary pycuda "pycuda==2026.1" -d "$out"
fi
ls -l "$out"
du -sh "$out"
