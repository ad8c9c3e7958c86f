"""EmbeddingGemma (llama.cpp's `gemma-embedding`): Gemma 3's layers as an embedding model.

Gemma 3's layout (engine/models/gemma3.py) with bidirectional attention: every token sees the
whole text, and the sliding-window layers see the positions less than `sliding_window / 2 + 1`
away on either side (llama.cpp's symmetric window, transformers' `use_bidirectional_attention`).
The hidden states are mean-pooled (the file's `pooling_type`), then, where the file has them
(`--sentence-transformers-dense-modules`), put through sentence-transformers' two dense
projections without bias, `dense_2` (d_model -> 3072) and `dense_3` (3072 -> d_model), on
the host (one vector per text).
"""

from dataclasses import replace

import numpy as np

from backends.base import LayerAttention
from backends.dequant import dequantize
from engine.models import gemma3
from engine.models.block import LayerReader

DENSE = ("dense_2.weight", "dense_3.weight")


class Model(gemma3.Model):
    """An EmbeddingGemma model."""

    family = gemma3.Model.family
    causal = False

    def layer_attention(self, i: int) -> LayerAttention:
        """Gemma 3's settings, bidirectional, the window symmetric."""
        settings = super().layer_attention(i)
        window = None if settings.window is None else settings.window // 2 + 1
        return replace(settings, window=window, causal=False)

    def read_extra(self, reader: LayerReader) -> None:
        """The dense projections (out, in) as float32 host matrices, where the file has them."""
        tensors = reader.file.tensors
        self.dense = [dequantize(t.data, t.ggml_type, t.shape) for t in (tensors.get(n) for n in DENSE) if t]

    def project_embedding(self, pooled: np.ndarray) -> np.ndarray:
        """`pooled` (d_model,) through the dense projections: (d_model,)."""
        for matrix in self.dense:
            pooled = matrix.astype(np.float64) @ pooled  # (out,)
        return pooled
