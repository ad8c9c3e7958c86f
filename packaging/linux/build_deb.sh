#!/bin/sh
# Build dist/sprig_<version>_<arch>.deb and dist/sprig-<version>-linux-<arch>.tar.xz from
# the stripped bundle dist/sprig/ and the rendered icons: build_deb.sh VERSION ICONS_DIR
#
# The package tree (staged in build/deb/root/):
#   /opt/sprig/                       the PyInstaller bundle, as it is
#   /usr/bin/sprig                    the launcher: a link to /opt/sprig/sprig
#   /usr/share/applications/          the desktop entry ("Open with Sprig" for .gguf)
#   /usr/share/mime/packages/         the application/x-gguf type (by name and by magic)
#   /usr/share/metainfo/              the AppStream description (software centres)
#   /usr/share/icons/hicolor/         the icon, in the hicolor sizes and as SVG
#   /usr/share/man/man1/sprig.1.gz, /usr/share/doc/sprig/, the lintian overrides
# No maintainer scripts: dpkg's triggers (shared-mime-info, desktop-file-utils,
# hicolor-icon-theme) refresh the MIME, desktop and icon caches. The .tar.xz holds the
# same tree (opt/ and usr/), for other distributions. Both use xz at level 1: most of the
# bytes are the model and machine code, which level 6 shrinks by a few percent more at
# several times the CPU time (minutes, in CI).
set -eu
for tool in fakeroot:fakeroot dpkg-deb:dpkg-dev objdump:binutils xz:xz-utils; do
    command -v "${tool%%:*}" >/dev/null || {
        echo "make package needs ${tool%%:*}: apt-get install ${tool#*:} (or, as root, make package-deps)" >&2
        exit 2
    }
done
version="$1"
icons="$2"
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
bundle="$repo/dist/sprig"
stage="$repo/build/deb"
root="$stage/root"
arch="$(dpkg --print-architecture)"

rm -rf "$stage"
mkdir -p "$root/opt" "$root/usr/bin" "$root/DEBIAN"
cp -a "$bundle" "$root/opt/sprig"
ln -s /opt/sprig/sprig "$root/usr/bin/sprig"
install -D -m 644 "$here/org.sprig.Sprig.desktop" "$root/usr/share/applications/org.sprig.Sprig.desktop"
install -D -m 644 "$here/org.sprig.Sprig-gguf.xml" "$root/usr/share/mime/packages/org.sprig.Sprig-gguf.xml"
install -D -m 644 "$here/org.sprig.Sprig.metainfo.xml" "$root/usr/share/metainfo/org.sprig.Sprig.metainfo.xml"
mkdir -p "$root/usr/share/icons"
cp -r "$icons/hicolor" "$root/usr/share/icons/hicolor"
install -D -m 644 "$here/sprig.1" "$root/usr/share/man/man1/sprig.1"
gzip -9n "$root/usr/share/man/man1/sprig.1"
install -D -m 644 "$here/copyright" "$root/usr/share/doc/sprig/copyright"
install -D -m 644 "$here/changelog" "$root/usr/share/doc/sprig/changelog"
gzip -9n "$root/usr/share/doc/sprig/changelog"
install -D -m 644 "$here/lintian-overrides" "$root/usr/share/lintian/overrides/sprig"
chmod -R u+rwX,go+rX,go-w "$root"
find "$root/usr/share" "$root/opt/sprig/_internal" -type f \( -name '*.png' -o -name '*.svg' -o -name '*.qss' \
    -o -name '*.json' -o -name '*.gguf' -o -name '*.txt' -o -name '*.so*' \) -exec chmod 644 {} +

# The newest glibc symbol version any bundled ELF file asks for is the libc6 it needs.
glibc="$(find "$root/opt/sprig" -type f \( -name '*.so*' -o -name sprig \) -exec objdump -p {} + 2>/dev/null |
    grep -oE 'GLIBC_[0-9]+\.[0-9]+(\.[0-9]+)?' | sed 's/GLIBC_//' | sort -uV | tail -n 1)"
size="$(du -sk --exclude=DEBIAN "$root" | cut -f1)"
sed -e "s/@VERSION@/$version/" -e "s/@ARCH@/$arch/" -e "s/@GLIBC@/$glibc/" -e "s/@SIZE@/$size/" \
    "$here/control.in" > "$root/DEBIAN/control"

mkdir -p "$repo/dist"
deb="$repo/dist/sprig_${version}_${arch}.deb"
fakeroot dpkg-deb -Zxz -z1 --threads-max=0 --build "$root" "$deb"
tarball="$repo/dist/sprig-${version}-linux-$(uname -m).tar.xz"
tar -C "$root" --owner=0 --group=0 --exclude=./DEBIAN --exclude=./usr/share/lintian -cf - . | xz -T0 -1 > "$tarball"
echo "built $deb and $tarball (needs glibc $glibc)"
