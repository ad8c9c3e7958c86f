#!/usr/bin/env bash
# Build PyCUDA's wheel from PyPI's source distribution into .whl/, with no GPU and no driver.
#
#   tools/gpu/build_pycuda_wheel.sh [PYTHON]
#
# PYTHON (default python3) is the interpreter the wheel is for: its version names the wheel
# (cp311, cp312). PyPI has only PyCUDA's source; building it needs `cuda.h` and
# `cudaProfiler.h` and a `libcuda.so` to link against:
#
# - by default the headers come from PyPI's `nvidia-cuda-runtime-cu12` and
#   `nvidia-cuda-profiler-api-cu12`, and the library is a stub (make_libcuda_stub.sh beside
#   this script), used only to link: the extension loads the real `libcuda.so.1` at run time;
# - with CUDA_ROOT set (the GPU machine: its toolkit), that toolkit's headers and its
#   `libcuda` (lib64/stubs or lib64) are used instead, and nothing is downloaded when the
#   source distribution is already in .whl/.
#
# The build tools (setuptools, wheel, numpy) are the interpreter's own where it has them all,
# else installed from PyPI into a venv of the build's own. CURAND is left out
# (CUDA_ENABLE_CURAND=False): Sprig does not use it, and it would need libcurand.
# Takes about 4 minutes on 2 cores.
set -euo pipefail

PYTHON=${1:-python3}
PYCUDA_VERSION=2026.1
CUDA_HEADERS_VERSION=12.9.79
repo=$(cd "$(dirname "$0")/../.." && pwd)
out=$repo/.whl
sdist=$out/pycuda-$PYCUDA_VERSION.tar.gz
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$out"

py=$PYTHON
if ! "$py" -c "import setuptools, wheel, numpy" 2>/dev/null; then
    "$PYTHON" -m venv "$work/venv"
    py=$work/venv/bin/python
    "$py" -m pip install -q setuptools wheel numpy
fi
if [ ! -f "$sdist" ]; then
    "$py" -m pip download -q --no-deps --no-binary pycuda --no-build-isolation "pycuda==$PYCUDA_VERSION" -d "$out"
fi

if [ -n "${CUDA_ROOT:-}" ]; then
    cuda_root=$CUDA_ROOT
    lib_dirs="'$cuda_root/lib64/stubs', '$cuda_root/lib64', '$cuda_root/lib/stubs', '$cuda_root/lib'"
else
    cuda_root=$work/cuda
    mkdir -p "$cuda_root/include" "$cuda_root/lib"
    "$py" -m pip download -q --no-deps --only-binary :all: -d "$work/headers" \
        "nvidia-cuda-runtime-cu12==$CUDA_HEADERS_VERSION" "nvidia-cuda-profiler-api-cu12==$CUDA_HEADERS_VERSION"
    for wheel in "$work"/headers/*.whl; do
        unzip -q -o "$wheel" 'nvidia/*/include/*' -d "$work/headers"
    done
    cp -r "$work"/headers/nvidia/cuda_runtime/include/* "$work"/headers/nvidia/cuda_profiler_api/include/* \
        "$cuda_root/include/"
    "$repo/tools/gpu/make_libcuda_stub.sh" "$cuda_root/include" "$cuda_root/lib"
    lib_dirs="'$cuda_root/lib'"
fi

tar xzf "$sdist" -C "$work"
src=$work/pycuda-$PYCUDA_VERSION
cat >"$src/siteconf.py" <<EOF
CUDA_ROOT = '$cuda_root'
CUDA_INC_DIR = ['$cuda_root/include']
CUDADRV_LIB_DIR = [$lib_dirs]
CUDADRV_LIBNAME = ['cuda']
CUDA_ENABLE_CURAND = False
CUDA_ENABLE_GL = False
USE_SHIPPED_BOOST = True
EOF
(cd "$src" && "$py" -m pip wheel -q --no-deps --no-build-isolation -w "$out" .)
ls -l "$out"/pycuda-"$PYCUDA_VERSION"-*.whl
