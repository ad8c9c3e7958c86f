"""Tiny dense models of eight families and their reference numbers from transformers.

Run with the dev-only reference venv (torch CPU, transformers, gguf-py, llama-cpp-python),
never the app's venv, from the repository root:

    /work/refvenv/bin/python tools/make_dense_fixtures.py [--only phi3 gemma ...]

Families (llama.cpp architecture, transformers class): phi3 (Phi3ForCausalLM, Phi-4-mini style:
GPT2 tokenizer, partial rotary 0.75, LongRoPE, tied embeddings), gemma (GemmaForCausalLM),
command-r (CohereForCausalLM), cohere2 (Cohere2ForCausalLM), starcoder2, olmo2, granite,
smollm3. The same method as tools/make_moe_fixtures.py (whose helpers this imports):

1. A tiny tokenizer: byte-level BPE trained on tests/fixtures/ppl_text.txt with the family's
   real word-splitting regex and chat special tokens; Gemma a SentencePiece BPE model (byte
   fallback) trained on the same text. The real chat template goes into tokenizer_config.json,
   so the converter writes it as tokenizer.chat_template.
2. The transformers model from the small config in FAMILIES, seeded random weights
   (`init_weights`), saved float32.
3. llama.cpp's converter in-process with `get_vocab_base_pre` answering the family's real
   `tokenizer.ggml.pre`; every tensor of the F32 GGUF is checked bit-equal to the HF weight it
   came from after the converter's known transformations (`expected_gguf_tensors`).
4. `llama_model_quantize`: Q8_0 and Q4_K_M.
5. transformers float32 (eager) references into tests/fixtures/reference/tiny-<name>.npz:
   `prompt_<k>`, `logits` (last positions), `logits_all_<k>` (longest prompt), `greedy`,
   `greedy_margin`, and `<q>_logits` (transformers on the quantized file's weights dequantized by
   gguf-py); the .json has configs, files, GGUF metadata and tensors, llama.cpp's agreement, the
   chat template and its rendering (`chat_template`, `chat_messages`, `chat_rendered`).
6. llama.cpp (F32 K/V cache, plain CPU buffers) on every file; on F32 it must match transformers.

Phi-3 LongRoPE: transformers picks the factors per forward pass from the sequence length
(long when max position + 1 > original_max_position_embeddings); llama.cpp picks them once, from
the context size it is given (n_ctx_seq > n_ctx_orig_yarn = phi3.rope.scaling.original_context_length,
src/llama-model.cpp get_rope_factors). The agreement check therefore runs llama.cpp with
n_ctx = original context (32) for prompts of at most 32 tokens and a larger context for longer
ones; `rope_factors` in the .json says which factors transformers used for each prompt, and
`greedy_rope_factors_switch` the greedy step at which a from-scratch recomputation passes 32.
"""

import argparse
import itertools
import json
import math
import os
import re
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch
import transformers
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast
from transformers.utils.chat_template_utils import render_jinja_template

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_moe_fixtures import (  # noqa: E402  (the MoE script's helpers, unchanged)
    CORPUS, FTYPES, GREEDY_TOKENS, LLAMA_CPP, MODELS_DIR, O200K_REGEX, OUT_DIR, ROOT, agreement, gguf_summary,
    greedy, quantize)
import make_moe_fixtures as moe  # noqa: E402

# Word-splitting regexes, as llama.cpp's llama-vocab.cpp applies them for each pre-tokenizer.
LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")  # llama-bpe, dbrx
GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
DIGIT_SPLIT = r"\p{N}"  # starcoder, refact, command-r: each digit alone first, then GPT-2's regex

PROMPTS = moe.PROMPTS  # the same four prompts (2 to 40 tokens, cut at 40)
CHAT_MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Hello there!"},
    {"role": "assistant", "content": "Hi! How can I help you today?"},
    {"role": "user", "content": "Tell me a story about two rivers."},
]
FIXED_DATE = "26 June 2025"  # strftime_now() in templates that print today's date
LLAMA_CPP_F32_LIMIT = 1e-3  # llama.cpp on the F32 file must match transformers within this of the logit range


def _test_template(name: str) -> str:
    """A template string of llama.cpp's tests/test-chat-template.cpp, by its `.name`."""
    text = (LLAMA_CPP / "tests" / "test-chat-template.cpp").read_text(encoding="utf-8")
    at = text.index(f'/* .name= */ "{name}"')
    m = re.compile(r'/\* \.template_str= \*/ ((?:"(?:[^"\\]|\\.)*"\s*)+)', re.S).search(text, at)
    parts = re.findall(r'"((?:[^"\\]|\\.)*)"', m.group(1))
    return "".join(json.loads(f'"{p}"') for p in parts)


def _file_template(name: str) -> str:
    return (LLAMA_CPP / "models" / "templates" / name).read_text(encoding="utf-8")


# Templates written down here (not in the llama.cpp tree): from the models' tokenizer_config.json.
STARCODER2_INSTRUCT_TEMPLATE = (
    "{{bos_token}}{{'You are an exceptionally intelligent coding assistant that consistently delivers accurate and "
    "reliable responses to user instructions.\\n\\n'}}\n{%- for message in messages %}\n"
    "    {%- if message['role'] == 'system' %}\n"
    "        {{ raise_exception('System messages are not allowed in this template.') }}\n"
    "    {%- else %}\n        {%- if message['role'] == 'user' %}\n"
    "{{'### Instruction\\n' + message['content'] + '\\n\\n'}}\n        {%- else %}\n"
    "{{'### Response\\n' + message['content'] + eos_token + '\\n\\n'}}\n        {%- endif %}\n"
    "    {%- endif %}\n{%- endfor %}\n{{'### Response\\n'}}")
OLMO2_INSTRUCT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'system' %}"
    "{{ '<|system|>\\n' + message['content'] + '\\n' }}{% elif message['role'] == 'user' %}"
    "{{ '<|user|>\\n' + message['content'] + '\\n' }}{% elif message['role'] == 'assistant' %}"
    "{% if not loop.last %}{{ '<|assistant|>\\n'  + message['content'] + eos_token + '\\n' }}"
    "{% else %}{{ '<|assistant|>\\n'  + message['content'] + eos_token }}{% endif %}{% endif %}"
    "{% if loop.last and add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}{% endfor %}")


@dataclass(frozen=True)
class Family:
    """One tiny dense model."""

    name: str  # tiny-<name>-<type>.gguf, reference/tiny-<name>.npz
    arch: str  # GGUF general.architecture
    hf_class: str  # transformers model class
    config_class: str
    pre: str | None  # tokenizer.ggml.pre (None: SentencePiece)
    splits: tuple[str, ...]  # regexes applied in turn before byte-level BPE
    specials: tuple[str, ...]  # special tokens, ids 0.. in this order
    bos: str | None
    eos: str
    config: dict[str, Any]
    template: str  # function name resolving the template, see `chat_template`
    template_source: str
    seed: int = 0
    scales: dict[str, float] = field(default_factory=dict)
    system_ok: bool = True  # the template accepts a system message
    tokenizer_class: str | None = None  # written into tokenizer_config.json
    quants: tuple[str, ...] = ("q8_0", "q4_k_m")


COMMON = dict(vocab_size=384, hidden_size=256, intermediate_size=256, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=256)


def _cfg(**kw) -> dict[str, Any]:
    return {**COMMON, **kw}


FAMILIES = {f.name: f for f in (
    Family(
        name="phi3", arch="phi3", hf_class="Phi3ForCausalLM", config_class="Phi3Config", pre="gpt-4o",
        splits=(O200K_REGEX,), specials=("<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"),
        bos="<|endoftext|>", eos="<|end|>", seed=1, tokenizer_class="GPT2Tokenizer",
        # Phi-4-mini: GPT2 tokenizer (o200k), partial rotary 0.75, LongRoPE, tied embeddings,
        # no sliding window (llama.cpp disables Phi-3's anyway).
        config=_cfg(max_position_embeddings=128, original_max_position_embeddings=32, tie_word_embeddings=True,
                    rms_norm_eps=1e-5,
                    sliding_window=None, bos_token_id=0, eos_token_id=4, pad_token_id=0,
                    rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
                                     "original_max_position_embeddings": 32,
                                     "short_factor": [round(1.0 + 0.02 * i, 4) for i in range(24)],
                                     "long_factor": [round(1.0 + 0.35 * i, 4) for i in range(24)]}),
        scales={"embed": 0.15},
        template="file:microsoft-Phi-3.5-mini-instruct.jinja",
        template_source="microsoft/Phi-3.5-mini-instruct (llama.cpp models/templates/microsoft-Phi-3.5-mini-instruct.jinja)"),
    Family(
        name="gemma", arch="gemma", hf_class="GemmaForCausalLM", config_class="GemmaConfig", pre=None,
        splits=(), specials=("<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"),
        bos="<bos>", eos="<eos>", seed=2, system_ok=False,
        config=_cfg(num_key_value_heads=1, hidden_act="gelu_pytorch_tanh", rms_norm_eps=1e-6,
                    tie_word_embeddings=True, pad_token_id=0, eos_token_id=1, bos_token_id=2,
                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
        scales={"embed": 0.05},  # x sqrt(256) on input: 0.8; larger lets the tied embedding echo the input
        template="test:google/gemma-7b-it",
        template_source="google/gemma-7b-it (llama.cpp tests/test-chat-template.cpp)"),
    Family(
        name="command-r", arch="command-r", hf_class="CohereForCausalLM", config_class="CohereConfig",
        pre="command-r", splits=(DIGIT_SPLIT, GPT2_REGEX),
        specials=("<PAD>", "<UNK>", "<CLS>", "<SEP>", "<MASK_TOKEN>", "<BOS_TOKEN>", "<EOS_TOKEN>",
                  "<|START_OF_TURN_TOKEN|>", "<|END_OF_TURN_TOKEN|>", "<|USER_TOKEN|>", "<|CHATBOT_TOKEN|>",
                  "<|SYSTEM_TOKEN|>"),
        bos="<BOS_TOKEN>", eos="<|END_OF_TURN_TOKEN|>", seed=3,
        config=_cfg(logit_scale=0.25, layer_norm_eps=1e-5, tie_word_embeddings=True, use_qk_norm=False,
                    pad_token_id=0, bos_token_id=5, eos_token_id=8,
                    rope_parameters={"rope_type": "default", "rope_theta": 8000000.0}),
        scales={"embed": 0.3},
        template="test:CohereForAI/c4ai-command-r-plus",
        template_source="CohereForAI/c4ai-command-r(-plus) 'default' template (llama.cpp tests/test-chat-template.cpp)"),
    Family(
        name="cohere2", arch="cohere2", hf_class="Cohere2ForCausalLM", config_class="Cohere2Config",
        pre="command-r", splits=(DIGIT_SPLIT, GPT2_REGEX),
        specials=("<PAD>", "<UNK>", "<CLS>", "<SEP>", "<MASK_TOKEN>", "<BOS_TOKEN>", "<EOS_TOKEN>",
                  "<|START_OF_TURN_TOKEN|>", "<|END_OF_TURN_TOKEN|>", "<|USER_TOKEN|>", "<|CHATBOT_TOKEN|>",
                  "<|SYSTEM_TOKEN|>", "<|START_RESPONSE|>", "<|END_RESPONSE|>", "<|START_THINKING|>",
                  "<|END_THINKING|>", "<|START_ACTION|>", "<|END_ACTION|>", "<|START_TOOL_RESULT|>",
                  "<|END_TOOL_RESULT|>"),
        bos="<BOS_TOKEN>", eos="<|END_OF_TURN_TOKEN|>", seed=4,
        # Command R7B: 3 sliding-window layers (RoPE) then 1 global layer (no positions at all);
        # llama.cpp's default pattern for cohere2 is 4 (the converter writes no pattern key).
        # `rotary_pct` is read by the converter only (transformers 5's Cohere2Config has none).
        config=_cfg(num_hidden_layers=4, logit_scale=0.25, layer_norm_eps=1e-5, tie_word_embeddings=True,
                    sliding_window=8, layer_types=["sliding_attention"] * 3 + ["full_attention"], rotary_pct=1.0,
                    pad_token_id=0, bos_token_id=5, eos_token_id=8,
                    rope_parameters={"rope_type": "default", "rope_theta": 50000.0}),
        scales={"embed": 0.5},
        template="file:CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja",
        template_source=("CohereForAI/c4ai-command-r7b-12-2024 'tool_use' template (llama.cpp models/templates/); "
                         "the 'default' one is not in the tree")),
    Family(
        name="starcoder2", arch="starcoder2", hf_class="Starcoder2ForCausalLM", config_class="Starcoder2Config",
        pre="starcoder", splits=(DIGIT_SPLIT, GPT2_REGEX),
        specials=("<|endoftext|>", "<fim_prefix>", "<fim_middle>", "<fim_suffix>", "<fim_pad>"),
        bos="<|endoftext|>", eos="<|endoftext|>", seed=5, system_ok=False,
        # sliding_window 4096 as StarCoder2-3B (longer than any prompt; the converter writes none).
        config=_cfg(hidden_act="gelu_pytorch_tanh", norm_epsilon=1e-5, use_bias=True, tie_word_embeddings=True,
                    sliding_window=4096, residual_dropout=0.0, embedding_dropout=0.0, attention_dropout=0.0,
                    bos_token_id=0, eos_token_id=0, intermediate_size=256,
                    rope_parameters={"rope_type": "default", "rope_theta": 100000.0}),
        scales={"embed": 0.15},
        template="const:STARCODER2_INSTRUCT_TEMPLATE",
        template_source=("bigcode/starcoder2-15b-instruct-v0.1 tokenizer_config.json (written from memory; the "
                         "base StarCoder2 models ship no chat template)")),
    Family(
        name="olmo2", arch="olmo2", hf_class="Olmo2ForCausalLM", config_class="Olmo2Config",
        pre="dbrx", splits=(LLAMA3_REGEX,),
        specials=("<|endoftext|>", "<|pad|>", "<|system|>", "<|user|>", "<|assistant|>"),
        bos="<|endoftext|>", eos="<|endoftext|>", seed=6,
        config=_cfg(rms_norm_eps=1e-6, tie_word_embeddings=False, attention_bias=False,
                    bos_token_id=0, eos_token_id=0, pad_token_id=1,
                    rope_parameters={"rope_type": "default", "rope_theta": 500000.0}),
        scales={"embed": 1.0, "lm_head": 0.15},
        template="const:OLMO2_INSTRUCT_TEMPLATE",
        template_source="allenai/OLMo-2-1124-7B-Instruct tokenizer_config.json (written from memory)"),
    Family(
        name="granite", arch="granite", hf_class="GraniteForCausalLM", config_class="GraniteConfig",
        pre="refact", splits=(DIGIT_SPLIT, GPT2_REGEX),
        specials=("<|end_of_text|>", "<fim_prefix>", "<fim_middle>", "<fim_suffix>", "<fim_pad>",
                  "<|start_of_role|>", "<|end_of_role|>", "<|tool_call|>"),
        bos="<|end_of_text|>", eos="<|end_of_text|>", seed=7,
        # untied here (Granite 3.x 2B ties): with the x12 embedding multiplier a tied matrix makes
        # every logit an echo of the input token.
        config=_cfg(rms_norm_eps=1e-6, tie_word_embeddings=False, embedding_multiplier=12.0,
                    residual_multiplier=0.22, attention_multiplier=0.015625, logits_scaling=8.0,
                    bos_token_id=0, eos_token_id=0, pad_token_id=0,
                    rope_parameters={"rope_type": "default", "rope_theta": 10000000.0}),
        scales={"embed": 0.1, "lm_head": 1.0},
        template="file:ibm-granite-granite-3.3-2B-Instruct.jinja",
        template_source="ibm-granite/granite-3.3-2b-instruct (llama.cpp models/templates/)"),
    Family(
        name="smollm3", arch="smollm3", hf_class="SmolLM3ForCausalLM", config_class="SmolLM3Config",
        pre="llama-bpe", splits=(LLAMA3_REGEX,),
        specials=("<|begin_of_text|>", "<|end_of_text|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"),
        bos="<|im_start|>", eos="<|im_end|>", seed=8,
        # every 4th layer without RoPE (no_rope_layers [1, 1, 1, 0]); llama.cpp hard-codes step 4.
        config=_cfg(num_hidden_layers=4, rms_norm_eps=1e-6, tie_word_embeddings=True, no_rope_layer_interval=4,
                    no_rope_layers=[1, 1, 1, 0], use_sliding_window=False, bos_token_id=None, eos_token_id=3,
                    pad_token_id=3, rope_parameters={"rope_type": "default", "rope_theta": 2000000.0}),
        scales={"embed": 0.15},
        template="file:HuggingFaceTB-SmolLM3-3B.jinja",
        template_source="HuggingFaceTB/SmolLM3-3B (llama.cpp models/templates/)"),
)}


def chat_template(family: Family) -> str:
    kind, _, arg = family.template.partition(":")
    if kind == "file":
        return _file_template(arg)
    if kind == "test":
        return _test_template(arg)
    return globals()[arg]


# ----------------------------------------------------------------------------------------------
# tokenizers


def build_tokenizer(family: Family, out_dir: Path, template: str):
    """The tiny tokenizer saved into `out_dir`; returns a function text -> ids (no specials added)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    vocab = family.config["vocab_size"]
    if family.pre is None:
        return _build_spm(family, out_dir, template)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in family.splits]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=list(family.specials),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train([str(CORPUS)], trainer)
    assert tok.get_vocab_size() == vocab, tok.get_vocab_size()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=family.bos, eos_token=family.eos)
    fast.save_pretrained(out_dir)
    _patch_tokenizer_config(out_dir, family, template)
    return lambda text: fast(text, add_special_tokens=False).input_ids


def _build_spm(family: Family, out_dir: Path, template: str):
    """Gemma: a SentencePiece BPE model (byte fallback) with Gemma's special ids 0..3 and turn markers."""
    import sentencepiece as spm

    prefix = out_dir / "spm"
    spm.SentencePieceTrainer.train(
        input=str(CORPUS), model_prefix=str(prefix), vocab_size=family.config["vocab_size"], model_type="bpe",
        byte_fallback=True, character_coverage=1.0, pad_id=0, eos_id=1, bos_id=2, unk_id=3,
        pad_piece="<pad>", eos_piece="<eos>", bos_piece="<bos>", unk_piece="<unk>",
        user_defined_symbols=list(family.specials[4:]), add_dummy_prefix=False, split_digits=True,
        remove_extra_whitespaces=False, normalization_rule_name="identity", num_threads=2,
        minloglevel=2)
    (out_dir / "tokenizer.model").write_bytes(prefix.with_suffix(".model").read_bytes())
    sp = spm.SentencePieceProcessor(model_file=str(out_dir / "tokenizer.model"))
    assert sp.vocab_size() == family.config["vocab_size"], sp.vocab_size()
    config = {"tokenizer_class": "GemmaTokenizer", "bos_token": family.bos, "eos_token": family.eos,
              "pad_token": "<pad>", "unk_token": "<unk>", "add_bos_token": True, "add_eos_token": False,
              "chat_template": template}
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
    (out_dir / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>",
         "additional_special_tokens": list(family.specials[4:])}), encoding="utf-8")
    return lambda text: sp.encode(text)


def _patch_tokenizer_config(out_dir: Path, family: Family, template: str) -> None:
    path = out_dir / "tokenizer_config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    config["chat_template"] = template
    if family.tokenizer_class:
        config["tokenizer_class"] = family.tokenizer_class
    path.write_text(json.dumps(config, indent=1, ensure_ascii=False), encoding="utf-8")


def render_chat(family: Family, template: str) -> tuple[list[dict], str]:
    """transformers' Jinja rendering (its sandboxed environment) of the two-turn chat."""
    messages = CHAT_MESSAGES if family.system_ok else CHAT_MESSAGES[1:]
    rendered = render_jinja_template(conversations=[messages], chat_template=template, add_generation_prompt=True,
                                     bos_token=family.bos or "", eos_token=family.eos,
                                     strftime_now=lambda fmt: FIXED_DATE)
    if isinstance(rendered, tuple):
        rendered = rendered[0]
    if isinstance(rendered, list):
        rendered = rendered[0]
    return messages, rendered


# ----------------------------------------------------------------------------------------------
# model


def model_classes(family: Family):
    return getattr(transformers, family.hf_class), getattr(transformers, family.config_class)


def init_weights(model: torch.nn.Module, family: Family) -> None:
    """Seeded random weights: norms 1 + 0.1 N (Gemma: 0.1 N, it adds 1 itself), biases 0.1 N,
    matrices N / sqrt(fan_in), embeddings `scales['embed']` N, an untied lm_head `scales['lm_head']` N.
    Tied embeddings are small (0.15) where the logits are the plain dot product, larger where the
    family divides the logits (Command-R's logit_scale, Granite's logits_scaling)."""
    gen = torch.Generator().manual_seed(family.seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if "norm" in name and name.endswith("weight"):
                value = 0.1 * noise if family.arch == "gemma" else 1.0 + 0.1 * noise
            elif name.endswith("bias"):
                value = 0.1 * noise
            elif name == "lm_head.weight":
                value = family.scales["lm_head"] * noise
            elif name.endswith("embed_tokens.weight"):
                value = family.scales["embed"] * noise
            elif p.ndim == 2:
                value = noise / math.sqrt(p.shape[1])
            else:
                raise ValueError(f"no rule for {name} {tuple(p.shape)}")
            p.copy_(value)


def build_model(family: Family, hf_dir: Path):
    cls, config_cls = model_classes(family)
    model = cls(config_cls(**family.config)).to(torch.float32).eval()
    init_weights(model, family)
    model.save_pretrained(hf_dir)
    return model


def convert(family: Family, hf_dir: Path, out: Path) -> None:
    moe.convert(family, hf_dir, out)  # uses family.pre only ("default" is written for SentencePiece)


# ----------------------------------------------------------------------------------------------
# HF <-> GGUF


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf's LlamaModel.permute: HF's half-split rotary layout to GGML's interleaved."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


PERMUTED = ("granite", "smollm3")  # converted by LlamaModel (undo_permute): q/k rows permuted


def _gguf_name(family: Family, n_layers: int, hf_name: str) -> str | None:
    arch = gguf.MODEL_ARCH[family.arch.upper().replace("-", "_")]
    return gguf.get_tensor_name_map(arch, n_layers).get_name(hf_name, try_suffixes=(".weight", ".bias"))


def expected_gguf_tensors(family: Family, model, sd: dict[str, np.ndarray] | None = None):
    """GGUF name -> (HF name or None, expected array, inverse: GGUF array -> HF array)."""
    if sd is None:
        sd = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    config = model.config
    n_layers, n_head, n_kv = config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads
    out: dict[str, tuple] = {}
    tied = getattr(config, "tie_word_embeddings", False)
    for hf, value in sd.items():
        if hf == "lm_head.weight" and tied:
            continue  # not saved (tied): llama.cpp uses token_embd
        name = _gguf_name(family, n_layers, hf)
        assert name is not None, f"no GGUF name for {hf}"
        fwd, inv = (lambda x: x), (lambda x: x)
        if family.arch == "gemma" and hf.endswith("norm.weight"):
            fwd, inv = (lambda x: x + 1), (lambda x: x - 1)  # GemmaModel.modify_tensors stores 1 + w
        elif family.arch in PERMUTED and hf.endswith("q_proj.weight"):
            fwd, inv = (lambda x: permute(x, n_head)), (lambda x: unpermute(x, n_head))
        elif family.arch in PERMUTED and hf.endswith("k_proj.weight"):
            fwd, inv = (lambda x: permute(x, n_kv)), (lambda x: unpermute(x, n_kv))
        out[name] = (hf, fwd(value), inv)
    if family.arch == "phi3":
        rp = config.rope_parameters
        out["rope_factors_long.weight"] = (None, np.asarray(rp["long_factor"], np.float32), None)
        out["rope_factors_short.weight"] = (None, np.asarray(rp["short_factor"], np.float32), None)
    return out


def check_same_weights(family: Family, model, path: Path) -> int:
    reader = gguf.GGUFReader(path)
    stored = {t.name: np.asarray(t.data) for t in reader.tensors}
    expected = expected_gguf_tensors(family, model)
    assert set(stored) == set(expected), sorted(set(stored) ^ set(expected))
    for name, (hf, want, _) in expected.items():
        got = stored[name]
        assert got.dtype == np.float32 and got.shape == want.shape, (name, hf, got.dtype, got.shape, want.shape)
        assert np.array_equal(got, want), (name, hf, float(np.abs(got - want).max()))
    return len(stored)


def hf_state_from_gguf(family: Family, model, path: Path) -> dict[str, torch.Tensor]:
    reader = gguf.GGUFReader(path)
    stored = {t.name: gguf.dequantize(t.data, t.tensor_type).astype(np.float32) for t in reader.tensors}
    sd = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    state = {}
    for name, (hf, want, inv) in expected_gguf_tensors(family, model, sd).items():
        if hf is not None:
            state[hf] = inv(stored[name].reshape(want.shape))
    if "lm_head.weight" in sd and "lm_head.weight" not in state:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]  # tied: the file's one token_embd
    assert set(state) == set(sd), sorted(set(state) ^ set(sd))
    return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in state.items()}


# ----------------------------------------------------------------------------------------------
# llama.cpp


def llama_cpp_logits(path: Path, prompts: list[list[int]], n_greedy: int = 0):
    """llama.cpp's all-position logits and greedy continuations: the MoE script's helper (F32 K/V
    cache, no flash attention, plain CPU buffers, n_ctx 128, which llama.cpp pads to 256)."""
    return moe.llama_cpp_logits(path, prompts, n_greedy)


# ----------------------------------------------------------------------------------------------


def record(family: Family, work: Path) -> dict[str, Any]:
    # The folder's name becomes general.name. llama.cpp gives special-token attributes by that name:
    # one containing "phi3"/"phi-3" needs "</s>", "<unk>" and "<s>" tokens (Phi-3's SentencePiece
    # vocabulary) or the file fails to load; Phi-4-mini's own name ("Phi 4 Mini Instruct") does not.
    hf_dir = work / ("tiny-phi4-mini" if family.arch == "phi3" else f"tiny-{family.name}")
    template = chat_template(family)
    encode = build_tokenizer(family, hf_dir, template)
    prompts = [encode(text)[:limit] for text, limit in PROMPTS]
    build_model(family, hf_dir)
    cls, _ = model_classes(family)
    model = cls.from_pretrained(hf_dir, dtype=torch.float32, attn_implementation="eager").eval()

    MODELS_DIR.mkdir(parents=True, exist_ok=True)
    files = {"f32": MODELS_DIR / f"tiny-{family.name}-f32.gguf"}
    convert(family, hf_dir, files["f32"])
    n_tensors = check_same_weights(family, model, files["f32"])
    print(f"{files['f32'].name}: {n_tensors} tensors, all equal to the HF weights (after the converter's transforms)")
    for q in family.quants:
        files[q] = MODELS_DIR / f"tiny-{family.name}-{q}.gguf"
        quantize(files["f32"], files[q], FTYPES[q])
    for key, path in files.items():
        print(f"  {path.relative_to(ROOT)}: {path.stat().st_size:,} bytes")

    longest = int(np.argmax([len(p) for p in prompts]))
    arrays: dict[str, np.ndarray] = {}
    ref_all, last, continuations, margins = [], [], [], []
    for k, ids in enumerate(prompts):
        arrays[f"prompt_{k}"] = np.asarray(ids, dtype=np.int64)
        with torch.no_grad():
            logits = model(torch.tensor([ids]), use_cache=False).logits[0].float().numpy()
        ref_all.append(logits)
        last.append(logits[-1])
        if k == longest:
            arrays[f"logits_all_{k}"] = logits
        tokens, step_margins = greedy(model, ids, GREEDY_TOKENS)
        continuations.append(tokens)
        margins.append(step_margins)
        print(f"  prompt {k}: {len(ids)} tokens, greedy {tokens[:8]}..., smallest top-2 margin {min(step_margins):.4f}")
    arrays["logits"] = np.stack(last).astype(np.float32)
    arrays["greedy"] = np.asarray(continuations, dtype=np.int64)
    arrays["greedy_margin"] = np.asarray(margins, dtype=np.float32)

    dequant_refs = {}
    long_rope = None
    if family.arch == "phi3":  # the long factors on every prompt (short_factor := long_factor), see below
        long_rope = {**family.config["rope_parameters"], "short_factor": family.config["rope_parameters"]["long_factor"]}
    for q in family.quants:
        state = hf_state_from_gguf(family, model, files[q])
        dq_model = cls.from_pretrained(hf_dir, dtype=torch.float32, attn_implementation="eager").eval()
        dq_model.load_state_dict(state, strict=True)
        with torch.no_grad():
            dq_all = [dq_model(torch.tensor([ids]), use_cache=False).logits[0].numpy() for ids in prompts]
        arrays[f"{q}_logits"] = np.stack([x[-1] for x in dq_all]).astype(np.float32)
        dequant_refs[q] = dq_all
        if long_rope is not None:
            dq_long = cls.from_pretrained(hf_dir, dtype=torch.float32, attn_implementation="eager",
                                          rope_parameters=long_rope).eval()
            dq_long.load_state_dict(state, strict=True)
            with torch.no_grad():
                dequant_refs[q] = [dq_long(torch.tensor([ids]), use_cache=False).logits[0].numpy() for ids in prompts]
            arrays[f"{q}_long_factor_logits"] = np.stack([x[-1] for x in dequant_refs[q]]).astype(np.float32)

    extra: dict[str, Any] = {}
    llama_ref = ref_all  # what llama.cpp should compute on every prompt
    if family.arch == "phi3":
        orig = family.config["rope_parameters"]["original_max_position_embeddings"]
        extra["rope_factors"] = ["long" if len(ids) > orig else "short" for ids in prompts]
        extra["greedy_rope_factors_switch"] = [orig - len(ids) + 1 if len(ids) <= orig else 0 for ids in prompts]
        # transformers with the long factors on every prompt (short_factor := long_factor): what
        # llama.cpp computes with any context size above the original context, which is always here.
        long_model = cls.from_pretrained(hf_dir, dtype=torch.float32, attn_implementation="eager",
                                         rope_parameters=long_rope).eval()
        with torch.no_grad():
            long_all = [long_model(torch.tensor([ids]), use_cache=False).logits[0].numpy() for ids in prompts]
        arrays["long_factor_logits"] = np.stack([x[-1] for x in long_all]).astype(np.float32)
        llama_ref = long_all
        extra["longrope_note"] = (
            f"transformers: long factors when a forward pass's max position + 1 > {orig} (Phi3RotaryEmbedding's "
            "dynamic longrope update), else short; so prompts of <= 32 tokens use the short factors and a "
            "from-scratch greedy step switches to long once the sequence passes the original context "
            "(greedy_rope_factors_switch: the first greedy step computed with long factors; 0: all are). "
            "llama.cpp (src/llama-model.cpp get_rope_factors): long when the context size per sequence "
            f"(cparams.n_ctx_seq) > n_ctx_orig_yarn ({orig}, phi3.rope.scaling.original_context_length), fixed "
            "for the whole context whatever the prompt length; it pads n_ctx up to a multiple of 256, so here it "
            "always takes the long factors. attn_factor (phi3.rope.scaling.attn_factor, sqrt(1 + ln(128/32) / "
            "ln 32)) multiplies cos and sin in both. `long_factor_logits` (npz): transformers' last-position "
            "logits with the long factors on every prompt (`<q>_long_factor_logits` the same on the dequantized "
            "weights); llama_cpp_agreement compares llama.cpp with those (all positions; its greedy counts "
            "still compare with the per-prompt `greedy`); `llama_cpp_vs_dynamic_reference` with the per-prompt "
            "choice of transformers.")
        dyn = agreement(ref_all, llama_cpp_logits(files["f32"], prompts)[0])
        extra["llama_cpp_vs_dynamic_reference"] = dyn
        short_vs_long = agreement(ref_all, long_all)
        extra["transformers_dynamic_vs_long_factors"] = short_vs_long
        print(f"  phi3: llama.cpp F32 vs transformers' per-prompt factor choice: {dyn['max_rel_diff']:.3g} of the "
              f"range (short-factor prompts differ); transformers dynamic vs all-long: "
              f"{short_vs_long['max_rel_diff']:.3g}")

    checks = {}
    for key, path in files.items():
        got_all, got_greedy = llama_cpp_logits(path, prompts, GREEDY_TOKENS)
        result = agreement(llama_ref, got_all)
        if key in dequant_refs:
            result["vs_transformers_on_dequantized_weights"] = agreement(dequant_refs[key], got_all)
        result["greedy_tokens_equal"] = int(sum(
            sum(1 for _ in itertools.takewhile(lambda ab: ab[0] == ab[1], zip(a, b)))
            for a, b in zip(continuations, got_greedy)))
        result["greedy_tokens"] = sum(len(g) for g in got_greedy)
        checks[key] = result
        print(f"  llama.cpp vs transformers, {path.name}: max |diff| {result['max_abs_diff']:.3g} "
              f"({result['max_rel_diff']:.3g} of the logit range), top-1 equal at "
              f"{result['top1_agree']}/{result['positions']} positions, greedy prefix equal "
              f"{result['greedy_tokens_equal']}/{result['greedy_tokens']} tokens")
        if key in dequant_refs:
            dq = result["vs_transformers_on_dequantized_weights"]
            print(f"    ... vs transformers on the file's dequantized weights: max |diff| {dq['max_abs_diff']:.3g} "
                  f"({dq['max_rel_diff']:.3g} of the range), top-1 equal at {dq['top1_agree']}/{dq['positions']}")

    messages, rendered = render_chat(family, template)
    info = {
        "model": f"tiny-{family.name}", "architecture": family.arch, "hf_class": family.hf_class,
        "transformers": transformers.__version__, "torch": torch.__version__,
        "reference": "transformers float32, eager attention, on the saved HF weights, which equal the F32 GGUF's",
        "hf_config": model.config.to_diff_dict(),
        "seed": family.seed, "init_scales": family.scales, "tokenizer_pre": family.pre or "default (SentencePiece)",
        "files": {k: {"file": p.name, "bytes": p.stat().st_size} for k, p in files.items()},
        "prompts": [{"text": t, "ids": ",".join(map(str, ids))} for (t, _), ids in zip(PROMPTS, prompts)],
        "logits_all_prompt": longest,
        "min_greedy_margin": [min(m) for m in margins],
        "llama_cpp_agreement": checks, **extra,
        "chat_template_source": family.template_source,
        "chat_template": template, "chat_messages": messages, "chat_rendered": rendered,
        "chat_render": ("transformers.utils.chat_template_utils.render_jinja_template (sandboxed Jinja2, "
                        f"trim_blocks, lstrip_blocks), add_generation_prompt=True, bos_token={family.bos!r}, "
                        f"eos_token={family.eos!r}, strftime_now -> {FIXED_DATE!r}"),
        "gguf": {k: gguf_summary(p) for k, p in files.items()},
    }
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(OUT_DIR / f"tiny-{family.name}.npz", **arrays)
    (OUT_DIR / f"tiny-{family.name}.json").write_text(json.dumps(info, indent=1, ensure_ascii=False, default=str)
                                                       + "\n", encoding="utf-8")
    f32_rel = checks["f32"]["max_rel_diff"]
    if f32_rel > LLAMA_CPP_F32_LIMIT:
        raise SystemExit(f"llama.cpp disagrees with transformers on {files['f32'].name}: {f32_rel:.3g} of the range")
    return info


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=sorted(FAMILIES))
    parser.add_argument("--keep", help="keep the HF models in this folder (default: a temporary one)")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.keep or tmp)
        for key in args.only or FAMILIES:
            print(f"== tiny-{key}", flush=True)
            record(FAMILIES[key], work)


if __name__ == "__main__":
    sys.exit(main())
