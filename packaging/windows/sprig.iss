; Inno Setup script for Sprig (NOT RUN: Sprig's CI has no Windows). Built by build.ps1,
; which first makes dist\sprig\ with PyInstaller from packaging\sprig.spec:
;   iscc /DAppVersion=0.1.0 /DSignTool=1 packaging\windows\sprig.iss
; Installs per user by default (no administrator rights needed), or for all users.

#ifndef AppVersion
  #define AppVersion "0.1.0"
#endif

[Setup]
AppId={{6C9A3E0E-2F1B-4C5B-9E7A-5B1D3A0C8F21}
AppName=Sprig
AppVersion={#AppVersion}
AppPublisher=The Sprig developers
DefaultDirName={autopf}\Sprig
DefaultGroupName=Sprig
PrivilegesRequired=lowest
PrivilegesRequiredOverridesAllowed=dialog
ArchitecturesAllowed=x64compatible
ArchitecturesInstallIn64BitMode=x64compatible
OutputDir=..\..\dist
OutputBaseFilename=Sprig-{#AppVersion}-windows-x64-setup
SetupIconFile=..\..\build\icons\sprig.ico
UninstallDisplayIcon={app}\sprig.exe
Compression=lzma2/max
SolidCompression=yes
WizardStyle=modern
ChangesAssociations=yes
#ifdef SignTool
; The signing command is defined once in the IDE or on the command line, e.g.
;   iscc "/Ssigntool=signtool.exe sign /fd sha256 /tr http://timestamp.digicert.com /td sha256 /a $f" ...
; Inno Setup signs the installer and the uninstaller with it.
SignTool=signtool
SignedUninstaller=yes
#endif

[Files]
Source: "..\..\dist\sprig\*"; DestDir: "{app}"; Flags: ignoreversion recursesubdirs createallsubdirs

[Icons]
Name: "{group}\Sprig"; Filename: "{app}\sprig.exe"
Name: "{group}\Uninstall Sprig"; Filename: "{uninstallexe}"
Name: "{autodesktop}\Sprig"; Filename: "{app}\sprig.exe"; Tasks: desktopicon

[Tasks]
Name: "desktopicon"; Description: "{cm:CreateDesktopIcon}"; Flags: unchecked

[Registry]
; "Open with Sprig" for .gguf files: a ProgID, offered through OpenWithProgids without
; taking the extension from another app that owns it. Root HKA is HKCU for a per-user
; install and HKLM for all users.
Root: HKA; Subkey: "Software\Classes\.gguf\OpenWithProgids"; ValueType: string; ValueName: "Sprig.gguf"; ValueData: ""; Flags: uninsdeletevalue
Root: HKA; Subkey: "Software\Classes\Sprig.gguf"; ValueType: string; ValueName: ""; ValueData: "GGUF language model"; Flags: uninsdeletekey
Root: HKA; Subkey: "Software\Classes\Sprig.gguf\DefaultIcon"; ValueType: string; ValueName: ""; ValueData: "{app}\sprig.exe,0"
Root: HKA; Subkey: "Software\Classes\Sprig.gguf\shell\open\command"; ValueType: string; ValueName: ""; ValueData: """{app}\sprig.exe"" ""%1"""
Root: HKA; Subkey: "Software\Classes\Applications\sprig.exe\SupportedTypes"; ValueType: string; ValueName: ".gguf"; ValueData: ""; Flags: uninsdeletekey

[Run]
Filename: "{app}\sprig.exe"; Description: "{cm:LaunchProgram,Sprig}"; Flags: nowait postinstall skipifsilent
