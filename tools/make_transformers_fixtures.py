"""Reference numbers from Hugging Face transformers, for tests/engine/test_against_transformers.py.

Run with the dev-only reference venv (torch CPU + transformers + gguf + accelerate), never
the app's venv, from the repository root:

    /work/refvenv/bin/python tools/make_transformers_fixtures.py [--only smollm2|gemma3|tiny-qwen3]

For each model, transformers runs in float32 on weights dequantized from the same GGUF
file the engine reads (by gguf-py, inside transformers' GGUF loader):

- SmolLM2-135M (llama) and Gemma-3-270M (gemma3): `from_pretrained(..., gguf_file=...)`.
  The script first checks that the loader undid the two conversions llama.cpp applies:
  the q/k row permutation of llama (HF q_proj == un-permuted attn_q) and gemma's norm
  offset (GGUF stores 1 + w, Gemma3RMSNorm multiplies by 1 + w, so HF must hold GGUF - 1).
- tiny-qwen3-f32 (tools/make_synthetic_qwen3.py): transformers' GGUF config mapping has no
  `key_length` for qwen3 and would assume head_dim 128, so the Qwen3Config is built from
  the file's metadata here and only the tensors come from transformers' GGUF loader.

Recorded in tests/fixtures/reference/<model>.npz (and a readable <model>.json):

- `prompt_<k>`: the token ids of each prompt (transformers' tokenizer built from the
  GGUF, special tokens parsed), so the engine's tokenizer is not under test here;
- `logits`: last-position logits of each prompt, float32, (n_prompts, vocab);
- `greedy`: 32 argmax tokens after each prompt, end-of-text tokens included like any other
  (no EOS stopping, no EOS suppression), and `greedy_margin`, the top-1 minus top-2 logit
  at each step (how close a step was to a tie);
- `ppl_ids`, `ppl`, `ppl_tokens_scored`, `ppl_window_nll` (summed NLL of each window):
  perplexity of tests/fixtures/ppl_text.txt with llama.cpp's protocol (see `perplexity`),
  on transformers' own tokenization of the text.
"""

import argparse
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3Config, Qwen3ForCausalLM
from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = ROOT / "tests" / "fixtures" / "reference"
PPL_TEXT = ROOT / "tests" / "fixtures" / "ppl_text.txt"
PPL_CTX = 256
GREEDY_TOKENS = 32


APP_PYTHON = ROOT / ".venv" / "bin" / "python"


@dataclass(frozen=True)
class Subject:
    """One model to record: a bundled model's key or a file, and the prompts to run."""

    key: str
    file: Path | None  # None: a bundled model, found by the engine's own lookup
    prompts: tuple[str, ...]

    @property
    def path(self) -> Path:
        if self.file is not None:
            return self.file
        # The bundled packages live in the app's venv; ask the engine there where the file is.
        lookup = f"from engine.bundled import bundled_model; print(bundled_model({self.key!r}).path)"
        done = subprocess.run([str(APP_PYTHON), "-c", lookup], cwd=ROOT, capture_output=True, text=True, check=True)
        return Path(done.stdout.strip())


SUBJECTS = {
    s.key: s
    for s in (
        Subject(
            "smollm2",
            None,
            (
                "The capital of France is",
                "Once upon a time, in a small village by the sea, there lived",
                'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
                "<|im_start|>user\nWhat is twelve times seven?<|im_end|>\n<|im_start|>assistant\n",
            ),
        ),
        Subject(
            "gemma3",
            None,
            (
                "The capital of France is",
                "Once upon a time, in a small village by the sea, there lived",
                "Le petit chat dort sur le canapé parce que",
            ),
        ),
        Subject(
            "tiny-qwen3",
            ROOT / "tests/fixtures/models/tiny-qwen3-f32.gguf",
            (
                "The town stood where two rivers met",
                "<|im_start|>user\nHello there!<|im_end|>\n<|im_start|>assistant\n",
                "Qwen3 größe: ünïcödé and CAPITALS",
                "and the miller said that the water was",
            ),
        ),
    )
}


def metadata(reader: gguf.GGUFReader, key: str, default=None):
    """One scalar metadata value of a GGUF file, read with gguf-py."""
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def load_bundled(path: Path):
    """A bundled model through transformers' own GGUF loading (config, tensors, tokenizer)."""
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32,
                                                 attn_implementation="eager")
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    return model.eval(), tokenizer


def load_tiny_qwen3(path: Path):
    """The synthetic Qwen3: config from the file's metadata, tensors from transformers' GGUF loader."""
    reader = gguf.GGUFReader(path)
    arch = metadata(reader, "general.architecture")
    assert arch == "qwen3", arch
    config = Qwen3Config(
        vocab_size=len(reader.fields["tokenizer.ggml.tokens"].data),
        hidden_size=metadata(reader, "qwen3.embedding_length"),
        intermediate_size=metadata(reader, "qwen3.feed_forward_length"),
        num_hidden_layers=metadata(reader, "qwen3.block_count"),
        num_attention_heads=metadata(reader, "qwen3.attention.head_count"),
        num_key_value_heads=metadata(reader, "qwen3.attention.head_count_kv"),
        head_dim=metadata(reader, "qwen3.attention.key_length"),
        rms_norm_eps=metadata(reader, "qwen3.attention.layer_norm_rms_epsilon"),
        max_position_embeddings=metadata(reader, "qwen3.context_length"),
        rope_parameters={"rope_type": "default", "rope_theta": metadata(reader, "qwen3.rope.freq_base")},
        tie_word_embeddings="output.weight" not in {t.name for t in reader.tensors},
        eos_token_id=metadata(reader, "tokenizer.ggml.eos_token_id"),
    )
    model = Qwen3ForCausalLM(config).to(torch.float32)
    tensors = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=model)["tensors"]
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    assert not unexpected and all(k == "lm_head.weight" and config.tie_word_embeddings for k in missing), (
        missing, unexpected)
    if config.tie_word_embeddings:
        model.tie_weights()
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    return model.eval(), tokenizer


def check_weight_conversions(key: str, model, path: Path) -> None:
    """Assert that transformers undid llama.cpp's q/k permutation (llama) or norm offset (gemma3)."""
    reader = gguf.GGUFReader(path)
    by_name = {t.name: t for t in reader.tensors}

    def gguf_tensor(name: str) -> np.ndarray:
        t = by_name[name]
        return gguf.dequantize(t.data, t.tensor_type)

    layer = model.model.layers[0]
    if key == "smollm2":
        n_heads = model.config.num_attention_heads
        stored = gguf_tensor("blk.0.attn_q.weight")  # rows permuted by llama.cpp's convert
        rows, cols = stored.shape
        # llama.cpp wrote row (h, i, r) of each head from HF row (h, r, i): halves interleaved.
        unpermuted = stored.reshape(n_heads, rows // n_heads // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)
        assert np.array_equal(layer.self_attn.q_proj.weight.detach().numpy(), unpermuted)
        assert not np.array_equal(unpermuted, stored)
    if key == "gemma3":
        for hf, name in ((layer.input_layernorm, "blk.0.attn_norm.weight"),
                         (layer.self_attn.q_norm, "blk.0.attn_q_norm.weight"),
                         (model.model.norm, "output_norm.weight")):
            assert np.allclose(1.0 + hf.weight.detach().numpy(), gguf_tensor(name), rtol=0, atol=1e-6), name


def last_logits(model, ids: list[int]) -> np.ndarray:
    """Logits after the last of `ids`, float32 (vocab,)."""
    with torch.no_grad():
        out = model(torch.tensor([ids]), use_cache=False, logits_to_keep=1)
    return out.logits[0, -1].float().numpy()


def greedy(model, ids: list[int], n: int) -> tuple[list[int], list[float]]:
    """`n` argmax tokens (each step recomputed from scratch, no cache) and the top-2 margins."""
    tokens, margins = list(ids), []
    for _ in range(n):
        logits = last_logits(model, tokens)
        top2 = np.sort(logits)[-2:]
        margins.append(float(top2[1] - top2[0]))
        tokens.append(int(np.argmax(logits)))
    return tokens[len(ids):], margins


def perplexity(model, ids: list[int], add_bos: bool, bos_id: int | None, ctx: int) -> tuple[float, int, list[float]]:
    """llama.cpp's `llama-perplexity` protocol over token ids: (ppl, tokens scored, summed NLL per window).

    Windows of `ctx` tokens start at 0, ctx, 2 ctx, ... while start + ctx < len(ids). When
    the model adds BOS, it replaces each window's first token. Each window scores the
    logits at positions ctx/2 .. ctx-2 against the tokens at ctx/2+1 .. ctx-1.
    """
    window_nll, scored = [], 0
    for start in range(0, len(ids), ctx):
        if start + ctx >= len(ids):
            break
        window = list(ids[start:start + ctx])
        if add_bos:
            window[0] = bos_id
        with torch.no_grad():
            logits = model(torch.tensor([window]), use_cache=False).logits[0].double()  # (ctx, vocab)
        logprobs = torch.log_softmax(logits[ctx // 2:ctx - 1], dim=-1)  # (ctx/2 - 1, vocab)
        targets = torch.tensor(window[ctx // 2 + 1:])
        window_nll.append(-float(logprobs[torch.arange(len(targets)), targets].sum()))
        scored += len(targets)
    return float(np.exp(sum(window_nll) / scored)), scored, window_nll


def record(subject: Subject) -> None:
    """Run one model and write its .npz and .json fixtures."""
    path = subject.path
    if subject.key == "tiny-qwen3":
        model, tokenizer = load_tiny_qwen3(path)
    else:
        model, tokenizer = load_bundled(path)
    check_weight_conversions(subject.key, model, path)

    reader = gguf.GGUFReader(path)
    add_bos = bool(metadata(reader, "tokenizer.ggml.add_bos_token", False))
    bos_id = metadata(reader, "tokenizer.ggml.bos_token_id")
    arrays: dict[str, np.ndarray] = {}
    info: dict = {"model": subject.key, "file": path.name,
                  "transformers": transformers.__version__, "torch": torch.__version__,
                  "prompts": [], "greedy_text": [], "min_greedy_margin": []}

    logits, continuations, margins = [], [], []
    for k, text in enumerate(subject.prompts):
        ids = tokenizer(text, add_special_tokens=True).input_ids
        arrays[f"prompt_{k}"] = np.asarray(ids, dtype=np.int64)
        logits.append(last_logits(model, ids))
        tokens, step_margins = greedy(model, ids, GREEDY_TOKENS)
        continuations.append(tokens)
        margins.append(step_margins)
        info["prompts"].append({"text": text, "ids": ",".join(map(str, ids))})
        info["greedy_text"].append(tokenizer.decode(tokens))
        info["min_greedy_margin"].append(min(step_margins))
        print(f"{subject.key} prompt {k}: {len(ids)} tokens -> {tokenizer.decode(tokens)!r}"
              f" (smallest top-2 margin {min(step_margins):.4f})", flush=True)
    arrays["logits"] = np.stack(logits).astype(np.float32)  # (n_prompts, vocab)
    arrays["greedy"] = np.asarray(continuations, dtype=np.int64)  # (n_prompts, 32)
    arrays["greedy_margin"] = np.asarray(margins, dtype=np.float32)  # (n_prompts, 32)

    text_ids = tokenizer(PPL_TEXT.read_text(encoding="utf-8"), add_special_tokens=False).input_ids
    ppl, scored, window_nll = perplexity(model, text_ids, add_bos, bos_id, PPL_CTX)
    arrays |= {"ppl_ids": np.asarray(text_ids, dtype=np.int64), "ppl": np.float64(ppl),
               "ppl_tokens_scored": np.int64(scored), "ppl_ctx": np.int64(PPL_CTX),
               "ppl_window_nll": np.asarray(window_nll, dtype=np.float64)}
    windows = len(window_nll)
    info |= {"ppl": ppl, "ppl_tokens_scored": scored, "ppl_windows": windows, "ppl_ctx": PPL_CTX,
             "ppl_text_tokens": len(text_ids), "ppl_add_bos": add_bos,
             "ppl_tokenization": "transformers' tokenizer built from the GGUF, no BOS"}
    print(f"{subject.key}: ppl {ppl:.4f} over {scored} tokens in {windows} windows", flush=True)

    OUT_DIR.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(OUT_DIR / f"{subject.key}.npz", **arrays)
    (OUT_DIR / f"{subject.key}.json").write_text(json.dumps(info, indent=1, ensure_ascii=False) + "\n",
                                                  encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    """Record every model, or only the one named by --only."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=sorted(SUBJECTS))
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    for key in [args.only] if args.only else SUBJECTS:
        record(SUBJECTS[key])


if __name__ == "__main__":
    sys.exit(main())
