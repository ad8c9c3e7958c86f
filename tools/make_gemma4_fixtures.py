"""Tiny Gemma 4 text models (dense and MoE) and their reference numbers from transformers.

Run with the dev-only reference venv (torch CPU, transformers, gguf-py, llama-cpp-python),
never the app's venv, from the repository root:

    /work/refvenv/bin/python tools/make_gemma4_fixtures.py [--only gemma4 gemma4-moe]

The method and the outputs are tools/make_dense_fixtures.py's (its `record` runs here, with the
three Gemma 4 parts below in place of its own): tiny random `Gemma4ForCausalLM` models, converted
by llama.cpp's `convert_hf_to_gguf.py` (its `Gemma4Model`), every F32 tensor checked bit-equal
to the HF weight it came from, quantized by `llama_model_quantize` (Q8_0, Q4_K_M), transformers
float32 references into tests/fixtures/reference/tiny-<name>.{npz,json}, and llama.cpp's
agreement on every file (on F32 it must match transformers).

- `gemma4` (the E2B/E4B layout, shrunk; hidden 256, 2 query heads and 1 key/value head, vocabulary
  384, window 8): sliding and global layers [S, F, S, F], the global ones with their own head
  size (64 against 32), their keys used as values (`attention_k_eq_v`) and proportional RoPE (a quarter of the head rotates, base 1e6); the last
  two layers reuse the keys and values of the first two (`num_kv_shared_layers` 2) and their MLP is
  twice as wide (`use_double_wide_mlp`); per-layer input embeddings of width 32; final soft-cap 30.
- `gemma4-moe` (the 26B-A4B layout, shrunk as above): [S, F], each feed-forward block a dense MLP
  beside a mixture of 4 experts (top 2, width 64; the router's own norm and scale, a scale per
  expert; gate and up fused in one tensor, as the converter writes them).

The tokenizer is Gemma 4's kind (`tokenizer.ggml.model` "gemma4"): a BPE over raw UTF-8 with
spaces written as U+2581, byte fallback to <0xXX> tokens, text cut only at newlines; trained on
tests/fixtures/ppl_text.txt with Gemma 4's special tokens. The chat template is Gemma 4 31B's (from
llama.cpp's models/templates/).
"""

import math
import sys
from pathlib import Path

import numpy as np
import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_dense_fixtures as dense  # noqa: E402  (its record(), with the Gemma 4 parts below)
from make_moe_fixtures import CORPUS  # noqa: E402

SPM_SPACE = "\u2581"
SPECIALS = ("<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<|turn>", "<turn|>", "<|think|>", "<|channel>",
            "<channel|>", "<|tool_call>", "<tool_call|>", "<|tool_response>", "<tool_response|>", '<|"|>')
BYTES = tuple(f"<0x{b:02X}>" for b in range(256))
TEMPLATE = "file:google-gemma-4-31B-it.jinja"
TEMPLATE_SOURCE = "google/gemma-4-31B-it (llama.cpp models/templates/google-gemma-4-31B-it.jinja)"

# llama.cpp's CPU GELU reads a float16 table (GGML_GELU_FP16 in ggml-cpu): its input and output
# rounded to float16. Gemma 4 applies GELU in every MLP and to every per-layer input, so llama.cpp
# on the F32 file differs from transformers by about 1.1e-3 of the logit range; with transformers'
# GELU rounded the same way the two agree within 6e-5 (checked when this script was written).
LLAMA_CPP_F32_LIMIT = 2e-3

COMMON = dict(vocab_size=384, vocab_size_per_layer_input=384, hidden_size=256, num_attention_heads=2,
              hidden_activation="gelu_pytorch_tanh", rms_norm_eps=1e-6, tie_word_embeddings=True,
              max_position_embeddings=256, sliding_window=8, final_logit_softcapping=30.0,
              pad_token_id=0, eos_token_id=1, bos_token_id=2,
              rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                               "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                                  "rope_theta": 1000000.0}})

FAMILIES = {f.name: f for f in (
    dense.Family(
        name="gemma4", arch="gemma4", hf_class="Gemma4ForCausalLM", config_class="Gemma4TextConfig", pre="gemma4",
        splits=(), specials=SPECIALS, bos="<bos>", eos="<turn|>", seed=11,
        config=dict(COMMON, num_hidden_layers=4, intermediate_size=64, num_key_value_heads=1, head_dim=32,
                    global_head_dim=64, num_global_key_value_heads=1, attention_k_eq_v=True,
                    layer_types=["sliding_attention", "full_attention"] * 2, num_kv_shared_layers=2,
                    use_double_wide_mlp=True, hidden_size_per_layer_input=32),
        scales={"embed": 0.05},
        template=TEMPLATE, template_source=TEMPLATE_SOURCE),
    dense.Family(
        name="gemma4-moe", arch="gemma4", hf_class="Gemma4ForCausalLM", config_class="Gemma4TextConfig",
        pre="gemma4", splits=(), specials=SPECIALS, bos="<bos>", eos="<turn|>", seed=12,
        config=dict(COMMON, num_hidden_layers=2, intermediate_size=64, num_key_value_heads=1, head_dim=32,
                    global_head_dim=64, num_global_key_value_heads=1, attention_k_eq_v=True,
                    layer_types=["sliding_attention", "full_attention"], hidden_size_per_layer_input=0,
                    enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=64),
        scales={"embed": 0.05, "router": 0.3},
        template=TEMPLATE, template_source=TEMPLATE_SOURCE),
)}


def build_tokenizer(family: dense.Family, out_dir: Path, template: str):
    """Gemma 4's kind of tokenizer, trained on the corpus and saved (tokenizer.json) into `out_dir`:
    the special tokens, then the 256 byte tokens, then BPE merges over U+2581-spaced text cut at
    newlines only. Returns a function text -> ids (no specials added)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", SPM_SPACE)
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[^\n]+|[\n]+"), behavior="isolated")
    tok.decoder = decoders.Sequence([decoders.Replace(SPM_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()])
    trainer = trainers.BpeTrainer(vocab_size=family.config["vocab_size"], special_tokens=[*family.specials, *BYTES],
                                  show_progress=False)
    tok.train([str(CORPUS)], trainer)
    assert tok.get_vocab_size() == family.config["vocab_size"], tok.get_vocab_size()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=family.bos, eos_token="<eos>", pad_token="<pad>",
                                   unk_token="<unk>", mask_token="<mask>",
                                   additional_special_tokens=["<|turn>", "<turn|>", "<|think|>"])
    fast.save_pretrained(out_dir)
    dense._patch_tokenizer_config(out_dir, family, template)
    return lambda text: fast(text, add_special_tokens=False).input_ids


def init_weights(model: torch.nn.Module, family: dense.Family) -> None:
    """Seeded random weights: norms 1 + 0.1 N (Gemma 4 multiplies by the weight itself), matrices
    N / sqrt(fan_in), the tied embedding `scales['embed']` N (x sqrt(256) on input), the router's
    rows `scales['router']` N, its input scale 1 + 0.1 N, the per-expert scales 1 + 0.2 N, the
    layer scalars 1 + 0.1 N; the experts (E, 2F, D) and (E, D, F) N / sqrt(fan_in)."""
    gen = torch.Generator().manual_seed(family.seed)
    hidden = family.config["hidden_size"]
    with torch.no_grad():
        tensors = {**dict(model.named_parameters()), **{k: v for k, v in model.named_buffers() if "layer_scalar" in k}}
        for name, p in sorted(tensors.items()):
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if "norm" in name and name.endswith("weight"):
                value = 1.0 + 0.1 * noise
            elif name.endswith(("router.scale", "layer_scalar")):
                value = 1.0 + 0.1 * noise
            elif name.endswith("per_expert_scale"):
                value = 1.0 + 0.2 * noise
            elif name.endswith("router.proj.weight"):
                value = family.scales["router"] * noise
            elif name.endswith("embed_tokens.weight"):
                value = family.scales["embed"] * noise
            elif name.endswith("embed_tokens_per_layer.weight"):
                value = noise
            elif name.endswith("experts.gate_up_proj"):
                value = noise / math.sqrt(hidden)
            elif name.endswith("experts.down_proj"):
                value = noise / math.sqrt(p.shape[-1])
            elif p.ndim == 2:
                value = noise / math.sqrt(p.shape[1])
            else:
                raise ValueError(f"no rule for {name} {tuple(p.shape)}")
            p.copy_(value)


def expected_gguf_tensors(family: dense.Family, model, sd: dict[str, np.ndarray] | None = None):
    """GGUF name -> (HF name or None, expected array, inverse: GGUF array -> HF array), as
    `make_dense_fixtures.expected_gguf_tensors`: Gemma 4's converter stores every weight as it is
    (no 1 + w on the norms), renames the router's two scales, and writes `rope_freqs.weight`: 1
    for the rotated pairs of the global layers' proportional RoPE, 1e30 (no rotation) for the rest."""
    if sd is None:
        sd = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    config = model.config
    renamed = {"router.scale": "ffn_gate_inp.scale", "router.per_expert_scale": "ffn_down_exps.scale"}
    out: dict[str, tuple] = {}
    for hf, value in sd.items():
        if hf == "lm_head.weight":
            continue  # tied: llama.cpp uses token_embd
        layer_part = hf.split(".", 3)[-1] if hf.startswith("model.layers.") else ""
        if layer_part in renamed:
            name = f"blk.{hf.split('.')[2]}.{renamed[layer_part]}"
        else:
            name = dense._gguf_name(family, config.num_hidden_layers, hf)
            assert name is not None, f"no GGUF name for {hf}"
            if not name.endswith((".weight", ".bias")):
                name += ".weight"  # layer_scalar, the experts' 3-D parameters
        out[name] = (hf, value, lambda x: x)
    full = config.rope_parameters["full_attention"]
    head_dim = family.config["global_head_dim"]
    rotated = int(head_dim * full["partial_rotary_factor"] / 2)
    freqs = np.array([1.0] * rotated + [1e30] * (head_dim // 2 - rotated), dtype=np.float32)
    out["rope_freqs.weight"] = (None, freqs, None)
    return out


def main(argv: list[str] | None = None) -> None:
    """make_dense_fixtures' command line and `record`, on the Gemma 4 families and parts."""
    dense.FAMILIES = FAMILIES
    dense.LLAMA_CPP_F32_LIMIT = LLAMA_CPP_F32_LIMIT
    dense.build_tokenizer, dense.init_weights = build_tokenizer, init_weights
    dense.expected_gguf_tensors = expected_gguf_tensors
    dense.main(argv)


if __name__ == "__main__":
    sys.exit(main())
