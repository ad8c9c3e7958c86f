"""Record RoPE scaling references: transformers' inverse frequencies for linear, Llama 3 and
YaRN scaling, and llama.cpp's converter's `rope_freqs.weight` for Llama 3.

    /work/refvenv/bin/python tools/make_rope_scaling_references.py \
        --llama-cpp /work/llama-src/llama_cpp_python-0.3.36/vendor/llama.cpp

Writes tests/fixtures/reference/rope_scaling.json: per case, the config it was made from,
`ROPE_INIT_FUNCTIONS[rope_type]`'s inverse frequencies and attention factor, and for
Llama 3 the per-frequency factors the converter writes into a GGUF file (what Sprig reads).
"""

import argparse
import json
import sys
from pathlib import Path
from types import SimpleNamespace

from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "reference" / "rope_scaling.json"
HEAD_DIM = 64
CASES = {
    "linear": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
    "llama3": {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
    "yarn": {
        "rope_type": "yarn",
        "rope_theta": 1000000.0,
        "factor": 4.0,
        "original_max_position_embeddings": 4096,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
    },
}


def converter_rope_freqs(llama_cpp: Path, rope: dict) -> list[float]:
    """The `rope_freqs.weight` llama.cpp's converter writes for a Llama 3 config."""
    sys.path[:0] = [str(llama_cpp), str(llama_cpp / "gguf-py")]
    from conversion.llama import LlamaModel  # llama.cpp's tree, found at run time

    converter = SimpleNamespace(
        rope_parameters=rope,
        hparams={"head_dim": HEAD_DIM},
        format_tensor_name=lambda kind: "rope_freqs.weight",
    )
    ((_, factors),) = LlamaModel.generate_extra_tensors(converter)
    return [float(f) for f in factors]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--llama-cpp", type=Path, required=True)
    args = parser.parse_args()
    out = {"head_dim": HEAD_DIM}
    for name, rope in CASES.items():
        config = LlamaConfig(
            hidden_size=4 * HEAD_DIM,
            num_attention_heads=4,
            max_position_embeddings=int(rope.get("original_max_position_embeddings", 4096) * rope["factor"]),
            rope_parameters=dict(rope),
        )
        inv_freq, attention_factor = ROPE_INIT_FUNCTIONS[rope["rope_type"]](config, device=None)
        out[name] = {"rope": rope, "inv_freq": inv_freq.double().tolist(), "attention_factor": float(attention_factor)}
    out["llama3"]["converter_rope_freqs"] = converter_rope_freqs(args.llama_cpp, CASES["llama3"])
    OUT.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
