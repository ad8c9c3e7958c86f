#!/bin/sh
# Strip the shared libraries of a PyInstaller bundle: strip BUNDLE_DIR
#
# Why here and not PyInstaller's strip=True: that one also strips the libraries that
# auditwheel vendored into `<package>.libs/` folders (NumPy's OpenBLAS in numpy.libs/),
# whose stripped copies fail to load. So those folders are skipped. The executable is
# skipped too: PyInstaller keeps the app's archive in its `pydata` section.
set -eu
command -v strip >/dev/null || { echo "make package needs strip: apt-get install binutils" >&2; exit 2; }
bundle="$1"
find "$bundle/_internal" -path '*.libs' -prune -o -type f -name '*.so*' -print |
while read -r lib; do
    case "$(head -c 4 "$lib" | od -An -c | tr -d ' ')" in
        '177ELF') strip --strip-unneeded "$lib" ;;
    esac
done
