"""A second, smaller model as the drafter, and whether it can draft for the main model.

The two must share a vocabulary: the checks follow llama.cpp's
`common_speculative_are_compatible` (common/speculative.cpp), and each refusal says why:
- the same vocabulary type (SentencePiece "llama", byte-level BPE "gpt2", ...);
- the same add-BOS flag and the same BOS and EOS ids;
- vocabulary sizes within `VOCAB_SIZE_MARGIN` of each other;
- identical text for every token id both have, from id `FIRST_CHECKED_ID` on.

`DraftModelDrafter` keeps its own KV cache across rounds and answers, brings it up to the
text before each proposal (reusing the prefix it holds), then drafts greedily (tokens
checked by sample-and-match) or, when the answer is sampled, draws from its own final
distribution q and hands q to the verifier's standard rule.
"""

from collections.abc import Sequence
from typing import Any

import numpy as np

from engine.decoding import Draft
from engine.kv_cache import KVCache
from engine.sampling import Sampler, SamplingParams

VOCAB_SIZE_MARGIN = 128  # llama.cpp's SPEC_VOCAB_MAX_SIZE_DIFFERENCE
FIRST_CHECKED_ID = 5  # llama.cpp's SPEC_VOCAB_CHECK_START_TOKEN_ID


def draft_refusals(target: dict[str, Any], draft: dict[str, Any]) -> list[str]:
    """Why a model with GGUF metadata `draft` cannot draft for one with `target`; [] if it can."""

    def get(meta: dict, key: str, default: Any = None) -> Any:
        return meta.get(f"tokenizer.ggml.{key}", default)

    reasons = []
    if get(target, "model") != get(draft, "model"):
        reasons.append(f"the vocabulary types differ ({get(target, 'model')} and {get(draft, 'model')})")
    default_bos = {"llama": True}.get(get(target, "model"), False)
    if get(target, "add_bos_token", default_bos) != get(draft, "add_bos_token", default_bos):
        reasons.append("one adds a BOS token to the prompt and the other does not")
    for name in ("bos", "eos"):
        ours, theirs = get(target, f"{name}_token_id"), get(draft, f"{name}_token_id")
        if ours != theirs:
            reasons.append(f"the {name.upper()} tokens differ (ids {ours} and {theirs})")
    tokens, draft_tokens = get(target, "tokens", []), get(draft, "tokens", [])
    if abs(len(tokens) - len(draft_tokens)) > VOCAB_SIZE_MARGIN:
        reasons.append(
            f"the vocabularies differ in size by more than {VOCAB_SIZE_MARGIN} "
            f"({len(tokens)} and {len(draft_tokens)} tokens)"
        )
    else:
        for i in range(FIRST_CHECKED_ID, min(len(tokens), len(draft_tokens))):
            if tokens[i] != draft_tokens[i]:
                reasons.append(f"token {i} differs ({tokens[i]!r} and {draft_tokens[i]!r})")
                break
    return reasons


class DraftModelDrafter:
    """Drafts with a second model (`model`, a Transformer) that shares the main model's vocabulary.

    `params` are the answer's sampling settings: greedy answers get greedy drafts, sampled
    answers drafts drawn from the draft model's distribution under the same settings.
    `vocab_size` is the main model's, the length of the distributions the verifier compares.
    """

    def __init__(self, model: Any, n_ctx: int, params: SamplingParams, vocab_size: int):
        self.model = model
        self.cache = KVCache(model, n_ctx)
        self.vocab_size = vocab_size
        self.retarget(params)

    def retarget(self, params: SamplingParams) -> None:
        """Draft for answers sampled with `params` from now on."""
        self.sampler = Sampler(params)
        self.sampled = params.temperature > 0.0

    def propose(self, history: Sequence[int], k: int) -> Draft:
        """k tokens from the draft model after `history`."""
        history = list(history)
        if k <= 0:
            return Draft([])
        held = self.cache.common_prefix(history)
        self.cache.truncate(min(held, len(history) - 1))  # the last token is fed again for its logits
        logits = None
        for lo in range(self.cache.n_used, len(history), 256):
            logits = self.cache.feed(self.model, history[lo : lo + 256])
        assert logits is not None  # the history is never empty: it ends with the last token
        tokens: list[int] = []
        probs: list[np.ndarray] = []
        for i in range(k):
            row = logits[-1][: self.vocab_size]  # ids the main model has
            if self.sampled:
                q = self.sampler.distribution(row, history + tokens)
                token = int(self.sampler.rng.choice(q.size, p=q))
                probs.append(np.pad(q, (0, self.vocab_size - q.size)))
            else:
                token = self.sampler.sample(row, history + tokens)
            tokens.append(token)
            if i < k - 1:
                if self.cache.n_free == 0:
                    break
                logits = self.cache.feed(self.model, [token])
        return Draft(tokens, np.array(probs) if self.sampled else None)
