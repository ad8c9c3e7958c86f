#!/bin/sh
# macOS recipe (NOT RUN: Sprig's CI has no Mac): Sprig.app, signed and notarized, in a .dmg.
#
#   packaging/macos/build.sh                 # unsigned: for trying it on this Mac
#   SIGN_ID="Developer ID Application: NAME (TEAMID)" NOTARY_PROFILE=sprig packaging/macos/build.sh
#
# Needs: Xcode's command-line tools (codesign, hdiutil, iconutil, xcrun notarytool), Python
# 3.11+ from python.org or Homebrew, and `make install` done (venv, kernels, models).
# NOTARY_PROFILE is a keychain profile made once with:
#   xcrun notarytool store-credentials sprig --apple-id YOU@EXAMPLE.COM --team-id TEAMID
set -eu
cd "$(dirname "$0")/../.."
version="$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)"
app=dist/Sprig.app
dmg="dist/Sprig-$version-macos-$(uname -m).dmg"

# 1. Icons: the iconset rendered from resources/sprig.svg, then Apple's .icns.
rm -rf build/icons "$app" dist/sprig
.venv/bin/python packaging/render_icons.py build/icons --iconset
iconutil -c icns build/icons/Sprig.iconset -o build/icons/Sprig.icns

# 2. The app, from the same spec as Linux. Its Info.plist (in the spec) imports the .gguf
#    type (org.sprig.gguf) and declares Sprig its viewer; app/file_open.py receives the
#    QFileOpenEvent that Finder sends instead of argv.
.venv/bin/pyinstaller --noconfirm --log-level WARN --distpath dist --workpath build/pyinstaller packaging/sprig.spec
plutil -lint "$app/Contents/Info.plist"

# 3. Sign inside out (every Mach-O file, then the app) with the hardened runtime, which
#    notarization requires. Without SIGN_ID, an ad-hoc signature (runs on this Mac only).
identity="${SIGN_ID:--}"
find "$app/Contents" -type f \( -name '*.so' -o -name '*.dylib' -o -perm -u+x \) -print0 |
    xargs -0 codesign --force --timestamp --options runtime --sign "$identity"
codesign --force --timestamp --options runtime --entitlements packaging/macos/entitlements.plist \
    --sign "$identity" "$app"
codesign --verify --deep --strict --verbose=2 "$app"

# 4. The disk image: the app and a link to /Applications to drag it onto.
rm -rf build/dmg "$dmg"
mkdir -p build/dmg
cp -R "$app" build/dmg/
ln -s /Applications build/dmg/Applications
hdiutil create -volname "Sprig $version" -srcfolder build/dmg -fs HFS+ -format UDZO "$dmg"

# 5. Sign the image, notarize it with Apple, and staple the ticket so it opens offline.
if [ -n "${SIGN_ID:-}" ]; then
    codesign --force --timestamp --sign "$SIGN_ID" "$dmg"
    xcrun notarytool submit "$dmg" --keychain-profile "${NOTARY_PROFILE:?set NOTARY_PROFILE}" --wait
    xcrun stapler staple "$dmg"
    spctl --assess --type open --context context:primary-signature --verbose "$dmg"
fi
echo "built $dmg"

# 6. Check, on this Mac: the bundle's self-test, headless, with no Python around it.
env -i HOME="$HOME" "$app/Contents/MacOS/sprig" --self-test
