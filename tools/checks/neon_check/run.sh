#!/bin/sh
# The NEON kernels against the portable ones, bit for bit, without an arm64 machine:
# builds tools/checks/neon_check/kernels_probe.c for x86-64 (portable C) and for arm64 (NEON), runs
# the arm64 build under qemu-user, and compares what both print.
# Needs Debian's gcc-aarch64-linux-gnu and qemu-user:  apt-get install gcc-aarch64-linux-gnu qemu-user
set -eu
cd "$(dirname "$0")/../../.."
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
sources="tools/checks/neon_check/kernels_probe.c backends/cpu_kernels/q1_tiles.c backends/cpu_kernels/tq_tiles.c backends/cpu_kernels/quants.c
         backends/cpu_kernels/iq_dots.c backends/cpu_kernels/codes8_dots.c
         backends/cpu_kernels/int16_panels.c backends/cpu_kernels/byte_panels.c backends/cpu_kernels/row_tiles.c"
flags="-O2 -std=gnu11 -ffp-contract=off -fno-math-errno -Wno-psabi"
gcc $flags -o "$out/portable" $sources -lm
aarch64-linux-gnu-gcc $flags -static -o "$out/neon" $sources -lm
"$out/portable" > "$out/portable.txt"
qemu-aarch64 "$out/neon" > "$out/neon.txt"
if cmp -s "$out/portable.txt" "$out/neon.txt"; then
    echo "NEON and portable kernels agree bit for bit ($(wc -l < "$out/portable.txt") results)"
else
    echo "NEON and portable kernels differ:"; diff "$out/portable.txt" "$out/neon.txt" | head -20; exit 1
fi
