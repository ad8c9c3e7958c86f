#!/usr/bin/env bash
# A stand-in for the NVIDIA driver library, to link and import PyCUDA on a machine without one.
#
#   tools/gpu/make_libcuda_stub.sh CUDA_INCLUDE_DIR OUT_DIR
#
# Writes OUT_DIR/libcuda.so (soname libcuda.so.1, and that link beside it), exporting every
# driver function that CUDA_INCLUDE_DIR/cuda.h declares, under the names its macros give them
# (cuCtxCreate -> cuCtxCreate_v2 ...), and cudaProfiler.h's three (PyCUDA calls them too; that
# header is in another wheel). Each returns 100, CUDA_ERROR_NO_DEVICE, except the two that name
# an error, which name that one: with the stub, `pycuda.driver.init()` fails as on a machine
# with a driver and no GPU.
set -euo pipefail
include=$1
out=$2
mkdir -p "$out"
source=$(mktemp --suffix=.c)
trap 'rm -f "$source"' EXIT
{
    gcc -E -P "$include/cuda.h" | tr "\n" " " | grep -oE '\bCUresult[[:space:]]+cu[A-Za-z0-9_]+[[:space:]]*\(' \
        | sed -E 's/^CUresult[[:space:]]+//; s/[[:space:]]*\($//'
    printf '%s\n' cuProfilerInitialize cuProfilerStart cuProfilerStop
} | sort -u | grep -vE '^cuGetError(Name|String)$' | awk '{ printf "int %s(void) { return 100; }\n", $1 }' >"$source"
cat >>"$source" <<'EOF'
int cuGetErrorName(int error, const char **name) { *name = "CUDA_ERROR_NO_DEVICE"; return 0; }
int cuGetErrorString(int error, const char **text) { *text = "no CUDA-capable device is detected"; return 0; }
EOF
gcc -shared -fPIC -w -Wl,-soname,libcuda.so.1 -o "$out/libcuda.so" "$source"
ln -sf libcuda.so "$out/libcuda.so.1"
echo "$out/libcuda.so: $(wc -l <"$source") driver functions"
