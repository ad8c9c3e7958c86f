"""`python -m engine` file commands, run as a user would, in a subprocess."""

import json
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np

from engine.bundled import bundled_model

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def engine(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "engine", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=300)


def test_info_json_reports_the_published_shape():
    result = engine("info", "smollm2", "--json")
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    assert info["architecture"] == "llama" and info["context_length"] == 8192 and info["chat_template"]
    assert 130e6 < info["parameters"] < 140e6  # "135M"
    assert set(info["tensor_types"]) == {"Q4_1", "Q8_0", "F32"}
    reader = gguf.GGUFReader(bundled_model("smollm2").path)
    assert info["tensor_types"]["Q4_1"]["tensors"] == sum(t.tensor_type.name == "Q4_1" for t in reader.tensors)


def test_bench_json_on_a_bundled_model():
    result = engine("bench", "--model", "smollm2", "--backend", "numpy", "--prompt-tokens", "32",
                    "--gen-tokens", "8", "--json")
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout)
    assert {"prefill_tok_s", "decode_tok_s", "backend", "device"} <= set(figures)
    assert figures["backend"] == "numpy" and figures["prompt_tokens"] == 32 and figures["gen_tokens"] == 8
    assert figures["prefill_tok_s"] > 0 and figures["decode_tok_s"] > 0


def test_bench_past_the_models_context_says_so():
    result = engine("bench", "--model", "smollm2", "--prompt-tokens", "8190", "--gen-tokens", "8", "--fill", "random")
    assert result.returncode != 0
    assert "need a context of 8199 tokens, and SmolLM2-135M-Instruct.Q4_1.gguf was trained for 8192" in result.stderr


def test_tokenize_matches_llama_cpp_fixture():
    corpus = json.loads((FIXTURES / "tokenizer_corpus.json").read_text(encoding="utf-8"))
    ids = json.loads((FIXTURES / "tokenizer_ids.json").read_text(encoding="utf-8"))["models"]["smollm2"]["ids"]
    index = 3
    text = corpus[index] if isinstance(corpus, list) else corpus["strings"][index]
    result = engine("tokenize", "--model", "smollm2", "--text", text, "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == ids["plain"][index]


def test_tensor_writes_float32_equal_to_the_file(tmp_path):
    out = tmp_path / "norm.npy"
    result = engine("tensor", "--model", "smollm2", "--name", "output_norm.weight", "--out", out)
    assert result.returncode == 0, result.stderr
    reader = gguf.GGUFReader(bundled_model("smollm2").path)
    expected = next(t for t in reader.tensors if t.name == "output_norm.weight").data
    np.testing.assert_array_equal(np.load(out), expected)


def test_template_renders_messages(tmp_path):
    messages = tmp_path / "m.json"
    messages.write_text(json.dumps([{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]))
    result = engine("template", "--model", "smollm2", "--messages-file", messages)
    assert result.stdout == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
    bare = engine("template", "--model", "smollm2", "--messages-file", messages, "--no-generation-prompt")
    assert not bare.stdout.endswith("<|im_start|>assistant\n")


def test_errors_are_one_line_and_status_2(tmp_path):
    missing = engine("info", tmp_path / "nope.gguf")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUF" + b"\xff" * 60)
    corrupt = engine("tokenize", "--model", junk, "--text", "hi", "--json")
    no_tensor = engine("tensor", "--model", "smollm2", "--name", "nope", "--out", tmp_path / "x.npy")
    for result, needle in [(missing, "nope.gguf"), (corrupt, "junk.gguf"), (no_tensor, "no tensor called 'nope'")]:
        assert result.returncode == 2
        assert result.stderr.count("\n") == 1 and needle in result.stderr, result.stderr
