"""The images users' GPUs load: which cubin `kernel_image` picks for a device, when it falls
back to the PTX or to NVRTC, what it says when it cannot, and how images built from older
sources are noticed. The images are real, built by `build_cubins.build` from
`compile_kernels/sample.cu` into a temporary folder; the architecture of each cubin handed
back is read from its ELF header, not from its file name."""

import json
import shutil
import struct
from pathlib import Path

import pytest

from backends.cuda.build_cubins import build, main
from backends.cuda.compiler import nvrtc
from backends.cuda.modules import MANIFEST, kernel_image, pick_cubin, read_manifest, stale_modules
from backends.errors import BackendUnavailable

SAMPLES = Path(__file__).parent / "compile_kernels"
BUILT_ARCHS = ("sm_61", "sm_80", "sm_86", "sm_90", "sm_120")
NEW_DRIVER = 13000  # cuDriverGetVersion of a CUDA 13.0 driver
OLD_DRIVER = 12040  # CUDA 12.4


def cubin_sm(image: bytes) -> int:
    """The SM version a cubin was built for, from its ELF header: EI_OSABI 0x33 (the older CUDA
    ABI) keeps it in e_flags' low byte, 0x41 (sm_100 and newer) in the next byte."""
    assert image[:4] == b"\x7fELF" and image[4] == 2  # a 64-bit ELF file
    flags = struct.unpack_from("<I", image, 0x30)[0]  # e_flags of an ELF64 header
    return flags & 0xFF if image[7] == 0x33 else (flags >> 8) & 0xFF


@pytest.fixture(scope="module")
def kernels(tmp_path_factory) -> Path:
    """A kernel folder holding sample.cu and its header."""
    folder = tmp_path_factory.mktemp("kernels")
    for name in ("sample.cu", "sample.cuh"):
        shutil.copy(SAMPLES / name, folder / name)
    return folder


@pytest.fixture(scope="module")
def cubins(kernels, tmp_path_factory) -> Path:
    """The images of `kernels` for BUILT_ARCHS, built once."""
    try:
        nvrtc()
    except BackendUnavailable as missing:
        pytest.skip(f"NVRTC is not available ({missing}); `make install` installs it")
    outdir = tmp_path_factory.mktemp("cubins")
    assert build(outdir, kernels, BUILT_ARCHS) == []
    return outdir


@pytest.fixture
def no_sources(tmp_path) -> Path:
    """A kernel folder without the sources, as in the packaged app."""
    return tmp_path


def test_the_manifest_lists_each_image_and_the_drivers_ptx_needs(cubins, kernels):
    manifest = read_manifest(cubins)
    assert manifest["compiler"] == "NVRTC 12.9"
    assert manifest["ptx_driver"] == 12090  # cuDriverGetVersion of a CUDA 12.9 driver
    images = manifest["modules"]["sample"]["images"]
    assert sorted(images) == sorted([*BUILT_ARCHS, "compute_120"])
    assert sorted(p.name for p in cubins.iterdir()) == sorted([*images.values(), MANIFEST])
    assert stale_modules(cubins, kernels) == []


@pytest.mark.parametrize(
    ("capability", "sm"),
    [((6, 1), 61), ((6, 2), 61), ((8, 0), 80), ((8, 6), 86), ((8, 7), 86), ((8, 9), 86), ((9, 0), 90),
     ((12, 0), 120), ((12, 1), 120)],
)  # fmt: skip
def test_a_device_gets_the_cubin_of_its_major_and_the_highest_minor_not_above(cubins, kernels, capability, sm):
    image, name = kernel_image("sample", capability, NEW_DRIVER, cubins, kernels)
    assert name == f"sample.sm_{sm}.cubin"
    assert cubin_sm(image) == sm


@pytest.mark.parametrize(
    ("capability", "expected"),
    [((8, 9), "sm_89"), ((8, 7), "sm_86"), ((9, 0), "sm_90"), ((10, 0), None), ((7, 5), None), ((12, 1), "sm_120"),
     ((6, 0), None), ((5, 2), None)],
)  # fmt: skip
def test_pick_cubin(capability, expected):
    targets = ["sm_61", "sm_86", "sm_89", "sm_90", "sm_120", "compute_120"]
    assert pick_cubin(targets, capability) == expected


def test_a_newer_gpu_gets_the_ptx(cubins, no_sources):
    image, name = kernel_image("sample", (13, 0), NEW_DRIVER, cubins, no_sources)
    assert name == "sample.compute_120.ptx"
    assert b".target sm_120" in image and image.endswith(b"\0")


def test_the_ptx_needs_a_new_enough_driver(cubins, no_sources):
    with pytest.raises(BackendUnavailable) as raised:
        kernel_image("sample", (13, 0), OLD_DRIVER, cubins, no_sources)
    message = str(raised.value)
    assert "compute capability 13.0" in message
    assert "needs a driver for CUDA 12.9 or newer (575.51.03 on Linux, 576.02 on Windows)" in message
    assert "this driver supports CUDA 12.4: update the NVIDIA driver" in message


def test_an_older_gpu_without_a_cubin_is_compiled_by_nvrtc(cubins, kernels):
    image, name = kernel_image("sample", (7, 5), NEW_DRIVER, cubins, kernels)
    assert name == "sample.cu compiled by NVRTC 12.9 for sm_75"
    assert cubin_sm(image) == 75


def test_without_a_cubin_or_the_source_it_says_why(cubins, no_sources):
    with pytest.raises(BackendUnavailable) as raised:
        kernel_image("sample", (7, 5), NEW_DRIVER, cubins, no_sources)
    message = str(raised.value)
    assert "no cubin of sample for sm_75 (built: compute_120, sm_120, sm_61, sm_80, sm_86, sm_90)" in message
    assert "is not here to compile" in message


def test_a_module_never_built_says_so(cubins, no_sources):
    with pytest.raises(BackendUnavailable, match=r"no prebuilt images of products in"):
        kernel_image("products", (8, 6), NEW_DRIVER, cubins, no_sources)


@pytest.mark.parametrize("edited", ["sample.cu", "sample.cuh"])
def test_images_of_older_sources_are_stale(cubins, kernels, tmp_path, edited):
    changed = tmp_path / "kernels"
    shutil.copytree(kernels, changed)
    with (changed / edited).open("a") as file:
        file.write("// edited after the build\n")
    assert stale_modules(cubins, changed) == ["sample"]
    image, name = kernel_image("sample", (8, 6), NEW_DRIVER, cubins, changed)
    assert name == "sample.cu compiled by NVRTC 12.9 for sm_86"  # not the prebuilt sample.sm_86.cubin
    assert cubin_sm(image) == 86


def missing(*_: object, **__: object) -> None:
    """Stands in for NVRTC where its wheel is not installed."""
    raise BackendUnavailable("NVRTC is not installed")


def test_a_stale_image_without_nvrtc_says_to_rebuild(cubins, kernels, tmp_path, monkeypatch):
    changed = tmp_path / "kernels"
    shutil.copytree(kernels, changed)
    (changed / "sample.cu").write_text((changed / "sample.cu").read_text() + "// edited\n")
    monkeypatch.setattr("backends.cuda.modules.compile_nvrtc", missing)
    with pytest.raises(BackendUnavailable) as raised:
        kernel_image("sample", (8, 6), NEW_DRIVER, cubins, changed)
    assert "the prebuilt images of sample are stale, built from older sources (run `make install`)" in str(raised.value)
    assert "NVRTC is not installed" in str(raised.value)


def test_a_rebuild_compiles_only_what_changed(cubins, kernels, tmp_path):
    outdir = tmp_path / "cubins"
    shutil.copytree(cubins, outdir)
    before = {p.name: p.stat().st_mtime_ns for p in outdir.iterdir() if p.name != MANIFEST}
    assert build(outdir, kernels, BUILT_ARCHS) == []
    assert {p.name: p.stat().st_mtime_ns for p in outdir.iterdir() if p.name != MANIFEST} == before
    manifest = json.loads((outdir / MANIFEST).read_text())
    assert manifest == read_manifest(cubins)


def test_without_nvrtc_the_build_says_so_and_builds_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("backends.cuda.build_cubins.nvrtc", missing)
    assert main([str(tmp_path / "cubins")]) == 0  # `make install` goes on
    assert "build_cubins: no CUDA images built: NVRTC is not installed" in capsys.readouterr().out
    assert not (tmp_path / "cubins").exists()
