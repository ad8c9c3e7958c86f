"""Text embeddings: a text's tokens through the model, the final normed hidden states
pooled as the file says, and L2-normalised.

The pooling is the file's `{arch}.pooling_type` (llama.cpp's `enum llama_pooling_type`):
1 mean over the tokens, 2 the first token's state (CLS), 3 the last token's (Qwen3-Embedding).
A file that declares none is pooled by its last token (a causal model's last state is the
only one that has read the whole text); 0 (none, per-token vectors) and 4 (rank, rerankers)
are refused. The tokens are the text's, with BOS where the file adds it, and EOS where the
file says `tokenizer.ggml.add_eos_token` (Qwen3-Embedding ends its inputs with
<|endoftext|>).

Each text runs as its own pass (in chunks of PREFILL_CHUNK; a bidirectional model's, whose
tokens all see each other, in one), on a fresh state: the
backends batch several sequences only one token each (`Backend.attention_batch`), so texts
of different lengths cannot share a pass. The hidden states come from the model's one
forward path, stopped before the output head (`PassInput.hidden`); the pooled state goes
through the model's `project_embedding` (EmbeddingGemma's dense projections) before the norm.
"""

from collections.abc import Sequence

import numpy as np

from engine.errors import SprigError
from engine.generation import PREFILL_CHUNK
from engine.loader import LoadedModel

POOLING_NAMES = {1: "mean", 2: "cls", 3: "last"}
REFUSED_POOLING = {0: "none (one vector per token)", 4: "rank (a reranker)"}


class EmbeddingError(SprigError):
    """A text that cannot be embedded (empty, too long), or a model that embeds otherwise."""


def pooling(loaded: LoadedModel) -> str:
    """How `loaded` pools its hidden states: "mean", "cls" or "last"."""
    value = loaded.file.metadata.get(f"{loaded.config.architecture}.pooling_type")
    if value is None:
        return "last"
    if int(value) in POOLING_NAMES:
        return POOLING_NAMES[int(value)]
    what = REFUSED_POOLING.get(int(value), f"an unknown kind ({value})")
    raise EmbeddingError(f"{loaded.path.name} declares pooling {what}; Sprig embeds with mean, cls or last pooling.")


def embedding_tokens(loaded: LoadedModel, text: str) -> list[int]:
    """The tokens of `text` as the embedding model reads it (BOS and EOS as the file says)."""
    tokenizer = loaded.tokenizer
    tokens = tokenizer.encode(text)
    eos = loaded.file.metadata.get("tokenizer.ggml.eos_token_id")
    if loaded.file.metadata.get("tokenizer.ggml.add_eos_token") and eos is not None:
        tokens.append(int(eos))
    return tokens


def embed_tokens(loaded: LoadedModel, tokens: Sequence[int], how: str) -> np.ndarray:
    """The L2-normalised embedding of `tokens`: float32 (d_model,)."""
    model = loaded.model
    layers = model.layer_states(len(tokens))
    state = model.backend.allocate_state(layers)
    chunk = min([PREFILL_CHUNK, *(s.pass_tokens for s in layers if s.pass_tokens is not None)])
    if not model.causal:  # every token sees every other: the text in one pass
        chunks = [model.hidden_states(tokens, 0, state)]
    elif how == "cls":  # a causal model's first state has read only the first token
        chunks = [model.hidden_states(tokens[:1], 0, state)]
    else:
        chunks = [model.hidden_states(tokens[lo : lo + chunk], lo, state) for lo in range(0, len(tokens), chunk)]
    hidden = np.concatenate(chunks).astype(np.float64)  # (T, D)
    if how == "mean":
        vector = hidden.mean(axis=0)
    elif how == "cls":
        vector = hidden[0]
    else:
        vector = hidden[-1]
    vector = model.project_embedding(vector)
    norm = np.linalg.norm(vector)
    return (vector / norm if norm > 0 else vector).astype(np.float32)


def check_input(text: str, tokens: Sequence[int], limit: int, what: str = "The text") -> None:
    """EmbeddingError for an empty text, or one of more than `limit` tokens."""
    if not text or not tokens:
        raise EmbeddingError(f"{what} is empty: there is nothing to embed.")
    if len(tokens) > limit:
        raise EmbeddingError(f"{what} has {len(tokens)} tokens; this model embeds at most {limit}.")


def embed(loaded: LoadedModel, texts: Sequence[str], limit: int | None = None) -> tuple[list[np.ndarray], int]:
    """The embedding of each text, and the tokens read in all. Every text is checked (not
    empty, at most `limit` tokens: by default the model's context) before any runs."""
    how = pooling(loaded)
    limit = limit or loaded.config.context_length or 4096
    token_lists = [embedding_tokens(loaded, text) for text in texts]
    for i, tokens in enumerate(token_lists):
        check_input(texts[i], tokens, limit, f"Input {i}" if len(texts) > 1 else "The text")
    return [embed_tokens(loaded, tokens, how) for tokens in token_lists], sum(map(len, token_lists))
