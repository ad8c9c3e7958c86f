"""Tiny Qwen3 fixtures for LoRA adapters and embeddings, and their references from
transformers and PEFT.

Run with the dev-only reference venv (torch CPU, transformers, peft, gguf-py), never the
app's venv, from the repository root:

    /work/refvenv/bin/python tools/make_lora_embedding_fixtures.py

Deterministically (fixed seeds), into tests/fixtures/models and tests/fixtures/reference:

1. The tiny byte-level BPE tokenizer of tools/make_moe_fixtures.py (Qwen2's splitting).
2. LoRA: a tiny `Qwen3ForCausalLM` (seeded, float32) converted by llama.cpp's
   `convert_hf_to_gguf.py` (F32, tiny-lora-base-f32.gguf); two PEFT LoRA adapters on it
   with random A and B (`init_lora_weights=False`): "a" (r 4, alpha 8, every attention
   and MLP projection) and "b" (r 2, alpha 6, q, v and down), each converted by llama.cpp's
   `convert_lora_to_gguf.py` (F32, tiny-lora-a.gguf, tiny-lora-b.gguf); and "other", an
   adapter made the same way on a base of another width (tiny-lora-other.gguf), which must
   be refused. PEFT records (reference/tiny-lora.npz) the logits at every position of
   each prompt: `base_<k>` (no adapter), `a_<k>` (a at scale 1), `ab_<k>` (a at scale 0.5
   and b at scale 2, both active: PEFT's `set_scale`), and `prompt_<k>`.
3. Embeddings: a tiny `Qwen3ForCausalLM` with tied embeddings whose tokenizer ends every
   input with <|endoftext|> (a TemplateProcessing post-processor, as Qwen3-Embedding's), with
   a sentence-transformers `modules.json` and `1_Pooling/config.json` for each pooling
   (lasttoken, mean, cls), each converted by llama.cpp's converter, which writes
   `qwen3.pooling_type` from them (tiny-embed-<pooling>-f32.gguf). transformers records
   (reference/tiny-embed.npz): `ids_<k>` (the tokenizer's ids, EOS included) and
   `<pooling>_<k>`: the final normed hidden states (`Qwen3Model`'s last_hidden_state)
   pooled and L2-normalised, float32.
"""

import json
import math
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from peft import LoraConfig, get_peft_model
from tokenizers import processors
from transformers import Qwen3Config, Qwen3ForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_moe_fixtures import (  # noqa: E402
    LLAMA_CPP,
    MODELS_DIR,
    OUT_DIR,
    QWEN2_REGEX,
    SPECIAL_TOKENS,
    Family,
    build_tokenizer,
    convert,
)

PROMPTS = ["The quick brown fox jumps over the lazy dog.", "Once upon a time"]
TEXTS = ["The cat sat on the mat.", "A completely different sentence, somewhat longer than the first one.", "hi"]
CONFIG = dict(
    vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, max_position_embeddings=512, rms_norm_eps=1e-6,
    rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, attention_bias=False,
    use_sliding_window=False, bos_token_id=0, eos_token_id=2,
)
FAMILY = Family(name="lora", arch="qwen3", pre="qwen2", regex=QWEN2_REGEX, config=CONFIG, quants=(), seed=5,
                router_path="")
POOLINGS = {"last": "lasttoken", "mean": "mean", "cls": "cls"}


def base_model(seed: int, tied: bool, hidden: int = 64) -> Qwen3ForCausalLM:
    """A seeded tiny Qwen3: norms 1 + 0.1 N, matrices N / sqrt(fan_in), embeddings N, lm_head 0.15 N."""
    config = Qwen3Config(**{**CONFIG, "hidden_size": hidden, "tie_word_embeddings": tied})
    model = Qwen3ForCausalLM(config).to(torch.float32).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if "norm" in name:
                p.copy_(1.0 + 0.1 * noise)
            elif name.endswith("embed_tokens.weight"):
                p.copy_(noise)
            elif name == "lm_head.weight":
                p.copy_(0.15 * noise)
            else:
                p.copy_(noise / math.sqrt(p.shape[1]))
    return model


def save_base(model, tokenizer, hf_dir: Path) -> None:
    model.save_pretrained(hf_dir)
    tokenizer.save_pretrained(hf_dir)


def convert_lora(lora_dir: Path, base_dir: Path, out: Path) -> None:
    """llama.cpp's convert_lora_to_gguf.py, in its own process with its own gguf-py, F32."""
    code = (
        f"import sys; sys.path.insert(0, {str(LLAMA_CPP)!r}); sys.path.insert(0, {str(LLAMA_CPP / 'gguf-py')!r});"
        f"sys.argv = ['convert_lora_to_gguf.py', '--outtype', 'f32', '--outfile', {str(out)!r},"
        f" '--base', {str(base_dir)!r}, {str(lora_dir)!r}];"
        f"import runpy; runpy.run_path({str(LLAMA_CPP / 'convert_lora_to_gguf.py')!r}, run_name='__main__')"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if done.returncode:
        sys.stderr.write(done.stdout + done.stderr)
        raise RuntimeError(f"convert_lora_to_gguf failed for {lora_dir}")


def all_logits(model, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def make_lora(work: Path, tokenizer) -> None:
    base_dir = work / "base"
    model = base_model(FAMILY.seed, tied=False)
    save_base(model, tokenizer, base_dir)
    convert(FAMILY, base_dir, MODELS_DIR / "tiny-lora-base-f32.gguf")
    prompts = [tokenizer(p)["input_ids"] for p in PROMPTS]
    out: dict[str, np.ndarray] = {f"prompt_{k}": np.array(ids, dtype=np.int64) for k, ids in enumerate(prompts)}
    for k, ids in enumerate(prompts):
        out[f"base_{k}"] = all_logits(model, ids)

    torch.manual_seed(11)
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=ALL, init_lora_weights=False),
                                adapter_name="a")
    torch.manual_seed(12)
    peft_model.add_adapter("b", LoraConfig(r=2, lora_alpha=6, target_modules=["q_proj", "v_proj", "down_proj"],
                                           init_lora_weights=False))
    with torch.no_grad():  # PEFT's random init is small: make the adapters' effect clear
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.mul_(4.0)
    for name in ("a", "b"):
        peft_model.set_adapter(name)
        peft_model.save_pretrained(work / f"adapter-{name}", selected_adapters=[name])
        saved = next(p.parent for p in (work / f"adapter-{name}").rglob("adapter_config.json"))
        convert_lora(saved, base_dir, MODELS_DIR / f"tiny-lora-{name}.gguf")

    peft_model.set_adapter("a")
    for k, ids in enumerate(prompts):
        out[f"a_{k}"] = all_logits(peft_model, ids)
    peft_model.base_model.set_adapter(["a", "b"])
    for module in peft_model.modules():
        if hasattr(module, "set_scale") and hasattr(module, "scaling"):
            if "a" in module.scaling:
                module.set_scale("a", 0.5)
            if "b" in module.scaling:
                module.set_scale("b", 2.0)
    for k, ids in enumerate(prompts):
        out[f"ab_{k}"] = all_logits(peft_model, ids)
    np.savez_compressed(OUT_DIR / "tiny-lora.npz", **out)

    other_dir = work / "other-base"
    other = base_model(FAMILY.seed + 1, tied=False, hidden=32)
    save_base(other, tokenizer, other_dir)
    torch.manual_seed(13)
    other_peft = get_peft_model(other, LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"],
                                                  init_lora_weights=False))
    other_peft.save_pretrained(work / "other-adapter")
    convert_lora(work / "other-adapter", other_dir, MODELS_DIR / "tiny-lora-other.gguf")
    diffs = [float(np.abs(out[f"a_{k}"] - out[f"base_{k}"]).max()) for k in range(len(prompts))]
    print("lora: adapter a moves the logits by up to", max(diffs))


def make_embeddings(work: Path, tokenizer) -> None:
    emb_tok = tokenizer
    emb_tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="$A <|endoftext|>", pair="$A <|endoftext|> $B <|endoftext|>",
        special_tokens=[("<|endoftext|>", emb_tok.convert_tokens_to_ids("<|endoftext|>"))],
    )
    emb_tok.eos_token = SPECIAL_TOKENS[0]
    model = base_model(FAMILY.seed + 2, tied=True)
    out: dict[str, np.ndarray] = {}
    ids = [emb_tok(t)["input_ids"] for t in TEXTS]
    for k, row in enumerate(ids):
        out[f"ids_{k}"] = np.array(row, dtype=np.int64)
    for short, mode in POOLINGS.items():
        hf_dir = work / f"embed-{short}"
        save_base(model, emb_tok, hf_dir)
        (hf_dir / "modules.json").write_text(json.dumps([
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
            {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
        ]))
        (hf_dir / "1_Pooling").mkdir()
        (hf_dir / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 64,
                                                                       "pooling_mode": mode}))
        convert(FAMILY, hf_dir, MODELS_DIR / f"tiny-embed-{short}-f32.gguf")
        for k, row in enumerate(ids):
            with torch.no_grad():
                hidden = model.model(torch.tensor([row])).last_hidden_state[0].double().numpy()  # (T, D), normed
            vector = {"last": hidden[-1], "mean": hidden.mean(axis=0), "cls": hidden[0]}[short]
            out[f"{short}_{k}"] = (vector / np.linalg.norm(vector)).astype(np.float32)
    np.savez_compressed(OUT_DIR / "tiny-embed.npz", **out)
    print("embeddings:", {k: v.shape for k, v in out.items() if k.startswith("ids")})


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        tokenizer = build_tokenizer(FAMILY, work / "tok")
        make_lora(work, tokenizer)
        make_embeddings(work, tokenizer)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
