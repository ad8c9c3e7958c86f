"""Tiny Qwen3.5 models (dense and MoE: hybrid Gated DeltaNet / gated attention) and their
reference numbers from transformers.

Run with the dev-only reference venv (torch CPU, transformers, gguf-py, llama-cpp-python),
never the app's venv, from the repository root:

    /work/refvenv/bin/python tools/make_hybrid_fixtures.py [--only qwen35|qwen35moe] [--without-llama-cpp]

The method of tools/make_moe_fixtures.py, whose helpers this imports:

1. The tiny byte-level BPE tokenizer (Qwen2's word-splitting regex, ChatML special tokens).
2. `Qwen3_5ForCausalLM` / `Qwen3_5MoeForCausalLM` from the small configs below: 4 layers in the
   default 3:1 pattern (three Gated DeltaNet layers, then one gated full-attention layer),
   2 key heads and 4 value heads in the DeltaNet layers (so the converter's reordering of
   value heads is exercised), partial RoPE (a quarter of the head), tied embeddings (dense),
   a shared expert with its sigmoid gate (MoE). Seeded random weights (`init_weights`).
3. llama.cpp's `convert_hf_to_gguf.py` writes the F32 GGUF; every tensor is checked equal to
   the HF weight it came from after the converter's transformations (`expected_gguf_tensors`:
   norms + 1, A = -exp(A_log), value heads from grouped to tiled order, conv kernels squeezed).
4. `llama_model_quantize`: Q8_0 and Q4_K_M.
5. transformers float32 (eager attention; the Gated DeltaNet layers through its
   `torch_chunk_gated_delta_rule`, chunks of 64) records into
   tests/fixtures/reference/tiny-<name>.npz:
   - `prompt_<k>`: token ids of each prompt; the two long ones (> 192 tokens) span more than
     three chunks of 64;
   - `logits` (n_prompts, vocab): last-position logits; `logits_all_<k>` every position of the
     longest prompt;
   - `greedy`, `greedy_margin`: 16 argmax tokens after each prompt (recomputed from scratch);
   - `<q>_logits`: transformers on the quantized file's weights dequantized by gguf-py and
     undone from the converter's layout (`hf_state_from_gguf`);
   - `state_<k>` for the first prompt: each DeltaNet layer's recurrent state (Hv, Dk, Dv) and
     conv input window after the prompt (transformers' cache), value heads in the file's order.
6. llama.cpp (F32 K/V cache) on every file; on F32 it must agree with transformers.
"""

import argparse
import math
import sys
import tempfile
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch
import transformers
from transformers import Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig, Qwen3_5TextConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_moe_fixtures import (  # noqa: E402  (the MoE script's helpers)
    CORPUS, FTYPES, MODELS_DIR, QWEN2_REGEX, ROOT, Family, build_tokenizer, convert, greedy, gguf_summary,
    llama_cpp_checks, quantize, write_reference)

GREEDY_TOKENS = 16
COMMON = dict(
    vocab_size=384, hidden_size=256, num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1, head_dim=64,
    linear_conv_kernel_dim=4, linear_key_head_dim=32, linear_value_head_dim=32, linear_num_key_heads=2,
    linear_num_value_heads=4, max_position_embeddings=1024, rms_norm_eps=1e-6,
    rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                     "mrope_section": [2, 3, 3], "mrope_interleaved": True},
    bos_token_id=0, eos_token_id=2,  # <|endoftext|>, <|im_end|>
)
QWEN35 = Family(name="qwen35", arch="qwen35", pre="qwen2", regex=QWEN2_REGEX, seed=35, router_path="",
                quants=("q8_0", "q4_k_m"),
                config=dict(COMMON, intermediate_size=64, tie_word_embeddings=True))
QWEN35MOE = Family(name="qwen35moe", arch="qwen35moe", pre="qwen2", regex=QWEN2_REGEX, seed=36, router_path="mlp.gate",
                   quants=("q8_0", "q4_k_m"),
                   config=dict(COMMON, moe_intermediate_size=32, shared_expert_intermediate_size=32, num_experts=4,
                               num_experts_per_tok=2, tie_word_embeddings=False))
FAMILIES = {f.name: f for f in (QWEN35, QWEN35MOE)}
CHUNK = 64  # transformers' torch_chunk_gated_delta_rule chunk size


def prompts_text() -> list[tuple[str, int]]:
    """(text, at most this many tokens): two short prompts, and two long ones from the corpus
    that span more than three chunks of the recurrent scan."""
    corpus = CORPUS.read_text(encoding="utf-8")
    return [
        ("The town stood where two rivers met", 300),
        ("<|im_start|>user\nHello there!<|im_end|>\n<|im_start|>assistant\n", 300),
        (corpus[:1400], 200),
        (corpus[1400:3200], 260),
    ]


def init_weights(model: torch.nn.Module, family: Family) -> None:
    """Seeded random weights: norms 0.1 N (stored as w, applied as 1 + w; the gated norm's
    weight 1 + 0.1 N), A_log log U(1, 8), dt_bias 0.5 N, conv kernels N / 2, router 0.2 N,
    the shared expert's gate N / 16, the embeddings (tied or not) and the output 0.15 N, other
    matrices N / sqrt(fan_in)."""
    gen = torch.Generator().manual_seed(family.seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if name.endswith("linear_attn.norm.weight"):
                value = 1.0 + 0.1 * noise
            elif "norm" in name:
                value = 0.1 * noise
            elif name.endswith("A_log"):
                value = torch.log(1.0 + 7.0 * torch.rand(p.shape, generator=gen))
            elif name.endswith("dt_bias"):
                value = 0.5 * noise
            elif name.endswith("conv1d.weight"):
                value = 0.5 * noise
            elif name.endswith("mlp.gate.weight"):
                value = 0.2 * noise
            elif name.endswith("shared_expert_gate.weight"):
                value = noise / 16
            elif name.endswith("embed_tokens.weight") or name == "lm_head.weight":
                value = 0.15 * noise  # logits of std ~2.4
            elif name.endswith("experts.gate_up_proj") or name.endswith("experts.down_proj"):
                value = noise / math.sqrt(p.shape[-1])  # (E, out, in)
            elif p.ndim == 2:
                value = noise / math.sqrt(p.shape[1])
            else:
                raise ValueError(f"no rule for {name} {tuple(p.shape)}")
            p.copy_(value)


def model_class(family: Family):
    return Qwen3_5ForCausalLM if family.arch == "qwen35" else Qwen3_5MoeForCausalLM


def build_model(family: Family, hf_dir: Path):
    """The seeded transformers model of `family`, float32, saved to `hf_dir`."""
    config_cls = Qwen3_5TextConfig if family.arch == "qwen35" else Qwen3_5MoeTextConfig
    config = config_cls(**family.config)
    model = model_class(family)(config).to(torch.float32).eval()
    init_weights(model, family)
    model.save_pretrained(hf_dir)
    return model


def tiled(x: np.ndarray, axis: int, n_k: int, per_k: int, head: int) -> np.ndarray:
    """Value heads from grouped order (k head g's heads together) to tiled order (head j uses
    k head j % n_k), along `axis`: the converter's `_reorder_v_heads`."""
    shape = list(x.shape)
    x = x.reshape(shape[:axis] + [n_k, per_k, head] + shape[axis + 1:])
    return np.swapaxes(x, axis, axis + 1).reshape(shape)


def grouped(x: np.ndarray, axis: int, n_k: int, per_k: int, head: int) -> np.ndarray:
    """The inverse of `tiled`."""
    return tiled(x, axis, per_k, n_k, head)


def _linear_attn_pairs(cfg) -> dict[str, tuple[str, Any]]:
    """GGUF suffix -> (HF suffix, the layout change) of a DeltaNet layer's tensors."""
    hk, hv, dk, dv = (cfg.linear_num_key_heads, cfg.linear_num_value_heads, cfg.linear_key_head_dim,
                      cfg.linear_value_head_dim)
    per_k, qk = hv // hk, 2 * hk * dk

    def heads(axis: int, head: int):
        return lambda x, inverse=False: (grouped if inverse else tiled)(x, axis, hk, per_k, head)

    def qkv(x, inverse=False):
        return np.concatenate([x[:qk], heads(0, dv)(x[qk:], inverse)])

    def conv(x, inverse=False):  # HF (C, 1, K), GGUF (C, K)
        x = x.reshape(x.shape[0], -1)
        out = np.concatenate([x[:qk], heads(0, dv)(x[qk:], inverse)])
        return out[:, None, :] if inverse else out

    def a(x, inverse=False):  # A = -exp(A_log)
        return np.log(-heads(0, 1)(x, True)) if inverse else heads(0, 1)(-np.exp(x))

    return {
        "attn_qkv.weight": ("linear_attn.in_proj_qkv.weight", qkv),
        "attn_gate.weight": ("linear_attn.in_proj_z.weight", heads(0, dv)),
        "ssm_beta.weight": ("linear_attn.in_proj_b.weight", heads(0, 1)),
        "ssm_alpha.weight": ("linear_attn.in_proj_a.weight", heads(0, 1)),
        "ssm_dt.bias": ("linear_attn.dt_bias", heads(0, 1)),
        "ssm_a": ("linear_attn.A_log", a),
        "ssm_conv1d.weight": ("linear_attn.conv1d.weight", conv),
        "ssm_norm.weight": ("linear_attn.norm.weight", lambda x, inverse=False: x),
        "ssm_out.weight": ("linear_attn.out_proj.weight", heads(1, dv)),
    }


def _plus_one(x, inverse=False):
    return x - 1 if inverse else x + 1


def _same(x, inverse=False):
    return x


def tensor_pairs(family: Family, model) -> dict[str, tuple[str, Any]]:
    """Every GGUF tensor name -> (its HF name, the converter's change of it, invertible with
    inverse=True)."""
    cfg = model.config
    pairs: dict[str, tuple[str, Any]] = {
        "token_embd.weight": ("model.embed_tokens.weight", _same),
        "output_norm.weight": ("model.norm.weight", _plus_one),
    }
    if not cfg.tie_word_embeddings:
        pairs["output.weight"] = ("lm_head.weight", _same)
    for i, kind in enumerate(cfg.layer_types):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        layer = {"attn_norm.weight": ("input_layernorm.weight", _plus_one),
                 "post_attention_norm.weight": ("post_attention_layernorm.weight", _plus_one)}
        if kind == "linear_attention":
            layer |= _linear_attn_pairs(cfg)
        else:
            layer |= {f"attn_{x}.weight": (f"self_attn.{x}_proj.weight", _same) for x in "qkv"}
            layer |= {"attn_output.weight": ("self_attn.o_proj.weight", _same),
                      "attn_q_norm.weight": ("self_attn.q_norm.weight", _plus_one),
                      "attn_k_norm.weight": ("self_attn.k_norm.weight", _plus_one)}
        if family.arch == "qwen35":
            layer |= {f"ffn_{x}.weight": (f"mlp.{x}_proj.weight", _same) for x in ("gate", "up", "down")}
        else:
            layer |= {f"ffn_{x}_shexp.weight": (f"mlp.shared_expert.{x}_proj.weight", _same)
                      for x in ("gate", "up", "down")}
            layer |= {"ffn_gate_inp.weight": ("mlp.gate.weight", _same),
                      "ffn_gate_inp_shexp.weight": ("mlp.shared_expert_gate.weight", _same),
                      "ffn_down_exps.weight": ("mlp.experts.down_proj", _same)}
        pairs |= {b + k: (p + hf, f) for k, (hf, f) in layer.items()}
    return pairs


def expected_gguf_tensors(family: Family, model) -> dict[str, np.ndarray]:
    """What the converter should write for each HF tensor, by GGUF name (NumPy order)."""
    sd = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    out = {name: f(sd[hf]) for name, (hf, f) in tensor_pairs(family, model).items()}
    if family.arch == "qwen35moe":
        ff = model.config.moe_intermediate_size
        for i in range(model.config.num_hidden_layers):
            gate_up = sd[f"model.layers.{i}.mlp.experts.gate_up_proj"]  # (E, 2 ff, hidden): gate rows, then up
            out[f"blk.{i}.ffn_gate_exps.weight"] = gate_up[:, :ff]
            out[f"blk.{i}.ffn_up_exps.weight"] = gate_up[:, ff:]
    return out


def check_same_weights(family: Family, model, path: Path) -> int:
    """Assert the F32 GGUF holds exactly the HF model's weights after the converter's changes."""
    stored = {t.name: np.asarray(t.data) for t in gguf.GGUFReader(path).tensors}
    expected = expected_gguf_tensors(family, model)
    assert set(stored) == set(expected), sorted(set(stored) ^ set(expected))
    for name, want in expected.items():
        got = stored[name]
        assert got.dtype == np.float32 and got.shape == want.shape, (name, got.dtype, got.shape, want.shape)
        assert np.allclose(got, want, rtol=1e-6, atol=1e-7), name  # -exp(A_log) may round differently
    return len(stored)


def hf_state_from_gguf(family: Family, model, path: Path) -> dict[str, torch.Tensor]:
    """The HF state dict of a (quantized) GGUF file: dequantized by gguf-py, the converter's
    changes undone."""
    stored = {t.name: gguf.dequantize(t.data, t.tensor_type).astype(np.float32) for t in gguf.GGUFReader(path).tensors}
    sd = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    state = {hf: f(stored[name], inverse=True).reshape(sd[hf].shape)
             for name, (hf, f) in tensor_pairs(family, model).items()}
    if family.config.get("tie_word_embeddings"):
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    if family.arch == "qwen35moe":
        for i in range(model.config.num_hidden_layers):
            b = f"blk.{i}."
            state[f"model.layers.{i}.mlp.experts.gate_up_proj"] = np.concatenate(
                [stored[b + "ffn_gate_exps.weight"], stored[b + "ffn_up_exps.weight"]], axis=1)
    assert set(state) == set(sd), sorted(set(state) ^ set(sd))
    return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in state.items()}


def logits_of(model, ids: list[int]) -> np.ndarray:
    """transformers' logits at every position (T, vocab), no cache."""
    with torch.no_grad():
        return model(torch.tensor([ids]), use_cache=False).logits[0].float().numpy()


def recurrent_states(model, ids: list[int]) -> dict[str, np.ndarray]:
    """Each DeltaNet layer's state after `ids`, from transformers' cache: `ssm_<i>` (Hv, Dk, Dv)
    and `conv_<i>` (K - 1, C), the last K - 1 inputs of the convolution, in the file's order."""
    cfg = model.config
    hk, hv, dv = cfg.linear_num_key_heads, cfg.linear_num_value_heads, cfg.linear_value_head_dim
    qk = 2 * hk * cfg.linear_key_head_dim
    with torch.no_grad():
        out = model(torch.tensor([ids]), use_cache=True)
    cache, states = out.past_key_values, {}
    for i, kind in enumerate(cfg.layer_types):
        if kind != "linear_attention":
            continue
        ssm = cache.get_recurrent_state(i, state_idx=0)[0].numpy()  # (Hv, Dk, Dv), grouped
        conv = cache.get_conv_state(i, state_idx=0)[0].numpy()  # (C, K), the last K inputs
        states[f"ssm_{i}"] = tiled(ssm, 0, hk, hv // hk, 1)
        conv = conv[:, 1:].T  # (K - 1, C)
        states[f"conv_{i}"] = np.concatenate([conv[:, :qk], tiled(conv[:, qk:], 1, hk, hv // hk, dv)], axis=1)
    return states


def record(family: Family, work: Path, with_llama_cpp: bool = True) -> None:
    """Build, convert, quantize, check and record one family; without llama.cpp (its Python
    package missing), the F32 file and transformers' numbers only, as the .json says."""
    hf_dir = work / f"hf-{family.name}"
    tokenizer = build_tokenizer(family, hf_dir)
    texts = prompts_text()
    prompts = [tokenizer(text, add_special_tokens=False).input_ids[:limit] for text, limit in texts]
    assert max(len(p) for p in prompts) > 3 * CHUNK, [len(p) for p in prompts]
    build_model(family, hf_dir)
    cls = model_class(family)
    model = cls.from_pretrained(hf_dir, dtype=torch.float32, attn_implementation="eager").eval()

    MODELS_DIR.mkdir(parents=True, exist_ok=True)
    files = {"f32": MODELS_DIR / f"tiny-{family.name}-f32.gguf"}
    convert(family, hf_dir, files["f32"], ("--no-mtp",))
    n_tensors = check_same_weights(family, model, files["f32"])
    print(f"{files['f32'].name}: {n_tensors} tensors, equal to the HF weights after the converter's changes")
    for q in family.quants if with_llama_cpp else ():
        files[q] = MODELS_DIR / f"tiny-{family.name}-{q}.gguf"
        quantize(files["f32"], files[q], FTYPES[q])
    for key, path in files.items():
        print(f"  {path.relative_to(ROOT)}: {path.stat().st_size:,} bytes")

    longest = int(np.argmax([len(p) for p in prompts]))
    arrays: dict[str, np.ndarray] = {}
    ref_all, continuations, margins = [], [], []
    for k, ids in enumerate(prompts):
        arrays[f"prompt_{k}"] = np.asarray(ids, dtype=np.int64)
        logits = logits_of(model, ids)
        ref_all.append(logits)
        if k == longest:
            arrays[f"logits_all_{k}"] = logits
        tokens, step_margins = greedy(model, ids, GREEDY_TOKENS)
        continuations.append(tokens)
        margins.append(step_margins)
        print(f"  prompt {k}: {len(ids)} tokens, greedy {tokens[:8]}..., smallest top-2 margin {min(step_margins):.4f}")
    arrays["logits"] = np.stack([x[-1] for x in ref_all]).astype(np.float32)
    arrays["greedy"] = np.asarray(continuations, dtype=np.int64)
    arrays["greedy_margin"] = np.asarray(margins, dtype=np.float32)
    arrays |= {f"{k}_prompt_2": v for k, v in recurrent_states(model, prompts[2]).items()}

    dequant_refs = {}
    for q in family.quants if with_llama_cpp else ():
        dq_model = cls.from_pretrained(hf_dir, dtype=torch.float32, attn_implementation="eager").eval()
        dq_model.load_state_dict(hf_state_from_gguf(family, model, files[q]), strict=True)
        dequant_refs[q] = [logits_of(dq_model, ids) for ids in prompts]
        arrays[f"{q}_logits"] = np.stack([x[-1] for x in dequant_refs[q]]).astype(np.float32)

    checks = llama_cpp_checks(files, prompts, ref_all, continuations, dequant_refs, n_ctx=512) if with_llama_cpp else {}
    f32_rel = checks["f32"]["max_rel_diff"] if with_llama_cpp else 0.0
    if f32_rel > 1e-3:
        raise SystemExit(f"llama.cpp disagrees with transformers on {files['f32'].name}: {f32_rel:.3g} of the range")

    info = {
        "model": f"tiny-{family.name}", "architecture": family.arch,
        "transformers": transformers.__version__, "torch": torch.__version__,
        "reference": "transformers float32, eager attention, chunked gated delta rule (chunks of 64), no cache",
        "hf_config": model.config.to_diff_dict(), "seed": family.seed, "tokenizer_pre": family.pre,
        "files": {k: {"file": p.name, "bytes": p.stat().st_size} for k, p in files.items()},
        "prompts": [{"ids": ",".join(map(str, ids))} for ids in prompts],
        "logits_all_prompt": longest, "states_of_prompt": 2,
        "min_greedy_margin": [min(m) for m in margins],
        "llama_cpp_agreement": checks if with_llama_cpp else "not run: llama-cpp-python was not installed",
        "gguf": {k: gguf_summary(p) for k, p in files.items()},
    }
    write_reference(family.name, arrays, info)


def main(argv: list[str] | None = None) -> None:
    """Record both families, or the one named by --only."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=sorted(FAMILIES))
    parser.add_argument("--keep", help="keep the HF models in this folder (default: a temporary one)")
    parser.add_argument("--without-llama-cpp", action="store_true",
                        help="no quantized files and no llama.cpp check (where llama-cpp-python is missing)")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.keep or tmp)
        for key in [args.only] if args.only else FAMILIES:
            print(f"== tiny-{key}", flush=True)
            record(FAMILIES[key], work, not args.without_llama_cpp)


if __name__ == "__main__":
    sys.exit(main())
