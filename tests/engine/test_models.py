"""The architecture registry and the per-layer settings a model fixes when it loads."""

import numpy as np
import pytest

from engine.loader import load_model
from engine.models import ARCHITECTURES, SUPPORTED_ARCHITECTURES
from engine.models.common import Transformer
from tests.gguf_factory import write_tiny_model


def test_every_registered_architecture_names_its_family():
    # llama.cpp's names for the architectures Sprig runs (the `general.architecture` values).
    assert SUPPORTED_ARCHITECTURES == (
        "bert", "cohere2", "command-r", "gemma", "gemma-embedding", "gemma2", "gemma3", "gemma4", "gpt-oss", "granite",
        "llama", "olmo2", "phi3", "qwen2", "qwen3", "qwen35", "qwen35moe", "qwen3moe", "smollm3", "starcoder2",
    )
    for name, model_class in ARCHITECTURES.items():
        assert model_class.__module__ == f"engine.models.{name.replace('-', '_')}"
        assert "family" in vars(model_class)


def test_linear_rope_scaling_applies_to_gemma3s_global_layers_only(tmp_path):
    # Gemma 3's larger checkpoints scale RoPE linearly by 8 on their global layers; its
    # local layers keep base 10000 unscaled (transformers' Gemma3 rotary_emb_local).
    path = write_tiny_model(
        tmp_path / "g3.gguf", arch="gemma3", n_layers=6,
        **{"gemma3.rope.scaling.type": "linear", "gemma3.rope.scaling.factor": 8.0},
    )
    loaded = load_model(path, backend="numpy")
    try:
        ropes = [layer.mixer.rope for layer in loaded.model.layers]
        assert [r.base for r in ropes] == [10000.0] * 5 + [1e6]
        assert all(r.freq_factors is None for r in ropes[:5])
        assert np.array_equal(ropes[5].freq_factors, np.full(16 // 2, 8.0, np.float32))  # head_dim 16
        windows = [layer.mixer.settings.window for layer in loaded.model.layers]
        assert windows == [16] * 5 + [None]
    finally:
        loaded.close()


def test_per_layer_settings_are_not_rebuilt_while_generating(tmp_path, monkeypatch):
    loaded = load_model(write_tiny_model(tmp_path / "q3.gguf", arch="qwen3"), backend="numpy")
    try:
        tokens = np.array([5, 6, 7])
        cache = loaded.new_cache(32)
        before = loaded.model.forward(tokens, 0, cache.storage, all_logits=True)

        def asked(self, i):
            raise AssertionError(f"layer {i}'s settings were asked for again")

        monkeypatch.setattr(Transformer, "layer_rope", asked)
        monkeypatch.setattr(Transformer, "layer_attention", asked)
        again = loaded.new_cache(32)
        after = loaded.model.forward(tokens, 0, again.storage, all_logits=True)
        step = loaded.model.forward(np.array([8]), 3, again.storage)
        assert np.array_equal(before, after)
        assert step.shape == (1, loaded.config.vocab_size)
    finally:
        loaded.close()
