"""Tiny Qwen3 fixtures for LoRA adapters and embeddings, and their references from
transformers and PEFT.

Run with the dev-only reference venv (torch CPU, transformers, peft, gguf-py), never the
app's venv, from the repository root:

    /work/refvenv/bin/python tools/make_lora_embedding_fixtures.py [--only lora embed gemma phi3 bert]

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
4. EmbeddingGemma (`make_embedding_gemma`): a tiny bidirectional `Gemma3TextModel` as
   sentence-transformers saves it (mean pooling, two dense projections), converted with
   `--sentence-transformers-dense-modules` (tiny-embeddinggemma-f32.gguf, architecture
   `gemma-embedding`); sentence-transformers' vectors (reference/tiny-embeddinggemma.npz).
5. LoRA on Phi-3's fused tensors (`make_phi3_lora`): a PEFT adapter on the tiny Phi-3 of
   tools/make_dense_fixtures.py (tiny-lora-phi3.gguf, reference/tiny-lora-phi3.npz).
6. BERT (`make_bert`): a tiny `BertModel` with a WordPiece vocabulary of the corpus, CLS and mean
   pooling (tiny-bert-<pooling>-f32.gguf, reference/tiny-bert.npz).
"""

import argparse
import dataclasses
import json
import math
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import torch
from peft import LoraConfig, get_peft_model
from tokenizers import processors
from transformers import Qwen3Config, Qwen3ForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_moe_fixtures import (  # noqa: E402
    CORPUS,
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


GEMMA_CONFIG = dict(
    vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16, max_position_embeddings=512, rms_norm_eps=1e-6,
    sliding_window=6, use_bidirectional_attention=True, bos_token_id=0, eos_token_id=2, pad_token_id=1,
)


def seeded(model: torch.nn.Module, seed: int, norm_centre: float) -> None:
    """Norms norm_centre + 0.1 N, embeddings N, other matrices N / sqrt(fan_in), biases 0.1 N."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if "norm" in name.lower():
                p.copy_(norm_centre + 0.1 * noise)
            elif "embed" in name:
                p.copy_(noise)
            elif p.ndim == 1:
                p.copy_(0.1 * noise)
            else:
                p.copy_(noise / math.sqrt(p.shape[1]))


def sentence_transformer(hf_dir: Path, modules: list, out_dir: Path):
    """A sentence-transformers model of the transformers model in `hf_dir` and `modules`
    (pooling, dense, normalize), saved into `out_dir` as the converter reads it."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules.transformer import Transformer

    model = SentenceTransformer(modules=[Transformer(str(hf_dir)), *modules], device="cpu")
    model.save(str(out_dir))
    return model


def make_embedding_gemma(work: Path, tokenizer) -> None:
    """EmbeddingGemma: a tiny `Gemma3TextModel` with bidirectional attention (a window of 6:
    the long text crosses it), mean pooling and two dense projections (64 -> 96 -> 64), as
    sentence-transformers saves it; converted with --sentence-transformers-dense-modules."""
    from sentence_transformers.base.modules.dense import Dense
    from sentence_transformers.base.modules.normalize import Normalize
    from sentence_transformers.sentence_transformer.modules.pooling import Pooling
    from transformers import Gemma3TextConfig, Gemma3TextModel

    gemma_tok = tokenizer
    gemma_tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="<|endoftext|> $A <|im_end|>", special_tokens=[(t, gemma_tok.convert_tokens_to_ids(t))
                                                              for t in ("<|endoftext|>", "<|im_end|>")])
    gemma_tok.pad_token = SPECIAL_TOKENS[1]
    hf_dir = work / "gemma-hf"
    model = Gemma3TextModel(Gemma3TextConfig(**GEMMA_CONFIG)).to(torch.float32).eval()
    seeded(model, 21, 0.0)
    save_base(model, gemma_tok, hf_dir)
    torch.manual_seed(22)
    dense = [Dense(64, 96, bias=False, activation_function=torch.nn.Identity()),
             Dense(96, 64, bias=False, activation_function=torch.nn.Identity())]
    st_dir = work / "gemma-st"
    st = sentence_transformer(hf_dir, [Pooling(64, pooling_mode="mean"), *dense, Normalize()], st_dir)
    convert(FAMILY, st_dir, MODELS_DIR / "tiny-embeddinggemma-f32.gguf", ("--sentence-transformers-dense-modules",))
    vectors = [st.encode([t], convert_to_numpy=True)[0].astype(np.float32) for t in TEXTS]  # one by one: no padding
    out = {f"ids_{k}": np.array(gemma_tok(t)["input_ids"], dtype=np.int64) for k, t in enumerate(TEXTS)}
    out.update({f"vector_{k}": v for k, v in enumerate(vectors)})
    # without the dense projections (to show they matter)
    pooling_only = type(st)(modules=[st[0], st[1]], device="cpu")
    pooled = [pooling_only.encode([t], convert_to_numpy=True)[0] for t in TEXTS]
    out.update({f"no_dense_{k}": (v / np.linalg.norm(v)).astype(np.float32) for k, v in enumerate(pooled)})
    np.savez_compressed(OUT_DIR / "tiny-embeddinggemma.npz", **out)
    print("embeddinggemma: ids", [len(out[f"ids_{k}"]) for k in range(len(TEXTS))])


def make_phi3_lora(work: Path, _tokenizer) -> None:
    """LoRA on Phi-3's fused tensors: a PEFT adapter (r 4, alpha 8) on qkv_proj, gate_up_proj,
    o_proj and down_proj of tools/make_dense_fixtures.py's tiny Phi-3 (rebuilt here, checked
    bit-equal to tests/fixtures/models/tiny-phi3-f32.gguf), converted by llama.cpp
    (tiny-lora-phi3.gguf); PEFT's logits (reference/tiny-lora-phi3.npz): `prompt_<k>`,
    `base_<k>`, `lora_<k>`."""
    import make_dense_fixtures as dense

    family = dense.FAMILIES["phi3"]
    hf_dir = work / "phi3"
    encode = dense.build_tokenizer(family, hf_dir, dense.chat_template(family))
    model = dense.build_model(family, hf_dir)
    dense.check_same_weights(family, model, MODELS_DIR / "tiny-phi3-f32.gguf")
    prompts = [encode(p) for p in PROMPTS]
    out: dict[str, np.ndarray] = {f"prompt_{k}": np.array(ids, dtype=np.int64) for k, ids in enumerate(prompts)}
    for k, ids in enumerate(prompts):
        out[f"base_{k}"] = all_logits(model, ids)
    torch.manual_seed(14)
    targets = ["qkv_proj", "gate_up_proj", "o_proj", "down_proj"]
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=targets, init_lora_weights=False))
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.mul_(4.0)
    peft_model.save_pretrained(work / "phi3-adapter")
    convert_lora(work / "phi3-adapter", hf_dir, MODELS_DIR / "tiny-lora-phi3.gguf")
    for k, ids in enumerate(prompts):
        out[f"lora_{k}"] = all_logits(peft_model, ids)
    np.savez_compressed(OUT_DIR / "tiny-lora-phi3.npz", **out)
    print("phi3 lora: moves the logits by up to", float(np.abs(out["lora_0"] - out["base_0"]).max()))


BERT_CONFIG = dict(vocab_size=400, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                   max_position_embeddings=64, type_vocab_size=2, hidden_act="gelu", layer_norm_eps=1e-12)


def wordpiece_vocab(size: int) -> list[str]:
    """A deterministic lowercase WordPiece vocabulary of the corpus: BERT's specials, every
    character alone and as a continuation, then its most frequent words (ties by text)."""
    words = re.findall(r"\w+|[^\w\s]", CORPUS.read_text(encoding="utf-8").lower())
    chars = sorted(set("".join(words)))
    base = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *chars, *("##" + c for c in chars if c.isalnum())]
    counts = Counter(w for w in words if len(w) > 1)
    frequent = [w for w, _ in sorted(counts.items(), key=lambda item: (-item[1], item[0]))]
    return base + frequent[: size - len(base)]


def make_bert(work: Path, _tokenizer) -> None:
    """BERT: a WordPiece vocabulary trained on the corpus (lowercased), a tiny `BertModel`
    (GELU, post-norm layers, absolute positions, token types) as sentence-transformers saves
    it with CLS and with mean pooling, each converted by llama.cpp (tiny-bert-<pooling>-f32.gguf);
    sentence-transformers' vectors (reference/tiny-bert.npz): `ids_<k>`, `<pooling>_<k>`."""
    from sentence_transformers.base.modules.normalize import Normalize
    from sentence_transformers.sentence_transformer.modules.pooling import Pooling
    from transformers import BertConfig, BertModel, BertTokenizerFast

    tok_dir = work / "bert-tok"
    tok_dir.mkdir(parents=True)
    (tok_dir / "vocab.txt").write_text("\n".join(wordpiece_vocab(BERT_CONFIG["vocab_size"])) + "\n")
    tokenizer = BertTokenizerFast.from_pretrained(tok_dir)
    config = BertConfig(**{**BERT_CONFIG, "vocab_size": len(tokenizer)})
    model = BertModel(config, add_pooling_layer=False).to(torch.float32).eval()
    seeded(model, 31, 1.0)
    hf_dir = work / "bert-hf"
    save_base(model, tokenizer, hf_dir)
    out: dict[str, np.ndarray] = {f"ids_{k}": np.array(tokenizer(t)["input_ids"], dtype=np.int64)
                                  for k, t in enumerate(TEXTS)}
    for short in ("cls", "mean"):
        st = sentence_transformer(hf_dir, [Pooling(64, pooling_mode=short), Normalize()], work / f"bert-{short}")
        convert(dataclasses.replace(FAMILY, pre="default"), work / f"bert-{short}",
                MODELS_DIR / f"tiny-bert-{short}-f32.gguf")
        out.update({f"{short}_{k}": st.encode([t], convert_to_numpy=True)[0].astype(np.float32)
                    for k, t in enumerate(TEXTS)})
    np.savez_compressed(OUT_DIR / "tiny-bert.npz", **out)
    print("bert: vocab", len(tokenizer), "ids", [len(out[f"ids_{k}"]) for k in range(len(TEXTS))])


MAKERS = {"lora": make_lora, "embed": make_embeddings, "gemma": make_embedding_gemma, "phi3": make_phi3_lora, "bert": make_bert}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=sorted(MAKERS), default=sorted(MAKERS))
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for name in args.only:  # each on a fresh tokenizer: some change its post-processor
            MAKERS[name](work / name, build_tokenizer(FAMILY, work / name / "tok"))
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
