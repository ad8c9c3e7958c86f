"""The NumPy engine against an independent implementation: Hugging Face transformers.

The reference numbers in tests/fixtures/reference/ come from transformers in float32 on
weights dequantized from the same GGUF files (tools/fixtures/make_transformers_fixtures.py, run
with the dev-only reference venv; transformers is never imported here). For SmolLM2
(llama), Gemma-3-270M (gemma3) and a tiny synthetic Qwen3 (tools/fixtures/make_synthetic_qwen3.py):

- last-position logits of each prompt agree within 1e-3 of the reference vector's range;
- 32 greedy (argmax) tokens after each prompt are identical, end-of-text tokens included;
- perplexity of tests/fixtures/ppl_text.txt (llama.cpp's protocol, ctx 256) is within 0.5%.

Prompts are fed as the token ids recorded in the fixture, so tokenization is checked
separately (the engine must split the perplexity text into the reference's ids).

Bonsai's own 1 GB of weights are not needed: the tiny Qwen3 checks the architecture
against transformers, and a Q1_0 tiny Qwen3 must give the logits of its F32 twin, a file
holding its weights decoded here by hand.
"""

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter

from engine.bundled import bundled_model
from engine.generation import FINISH_LENGTH, FINISH_STOP_TOKEN, generate
from engine.loader import LoadedModel, load_model
from engine.perplexity import perplexity
from engine.sampling import SamplingParams

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
REFERENCE = FIXTURES / "reference"
PPL_TEXT = FIXTURES / "ppl_text.txt"
TINY_QWEN3 = FIXTURES / "models" / "tiny-qwen3-f32.gguf"
TINY_QWEN3_Q1_0 = FIXTURES / "models" / "tiny-qwen3-q1_0.gguf"
REPO_ROOT = FIXTURES.parent.parent

LOGIT_TOLERANCE = 1e-3  # of the reference logit vector's range (max - min)
PPL_TOLERANCE = 0.005  # relative


def model_path(key: str) -> Path:
    return TINY_QWEN3 if key == "tiny-qwen3" else bundled_model(key).path


@dataclass
class EngineRun:
    """What the engine computed for one model, beside the reference it is checked against."""

    key: str
    reference: dict[str, np.ndarray]
    loaded: LoadedModel
    prompts: list[list[int]]  # the reference's token ids
    logits: list[np.ndarray]  # last-position logits per prompt, (vocab,)
    greedy: list[list[int]]  # 32 argmax tokens per prompt


def greedy_decode(loaded: LoadedModel, prompt: list[int], n: int) -> tuple[np.ndarray, list[int]]:
    """Prefill `prompt`, then take the argmax `n` times through the KV cache.

    Returns the logits after the prompt, (vocab,), and the tokens. End-of-text tokens are
    ordinary tokens here, as in the reference.
    """
    cache = loaded.new_cache(len(prompt) + n)
    logits = loaded.model.forward(np.asarray(prompt, dtype=np.int64), 0, cache.storage)[-1]  # (vocab,)
    prompt_logits, tokens = logits, []
    for step in range(n):
        tokens.append(int(np.argmax(logits)))
        if step < n - 1:
            logits = loaded.model.forward(np.asarray(tokens[-1:], dtype=np.int64), len(prompt) + step,
                                          cache.storage)[-1]
    return prompt_logits, tokens


@pytest.fixture(scope="module", params=[
    pytest.param("smollm2", marks=pytest.mark.slow),
    pytest.param("gemma3", marks=pytest.mark.slow),
    "tiny-qwen3",
])
def run(request) -> EngineRun:
    """Load one model on the NumPy backend and run every prompt once for the whole module."""
    key = request.param
    with np.load(REFERENCE / f"{key}.npz") as data:
        reference = dict(data)
    loaded = load_model(model_path(key), "numpy")
    request.addfinalizer(loaded.close)
    prompts = [reference[f"prompt_{k}"].tolist() for k in range(len(reference["logits"]))]
    decoded = [greedy_decode(loaded, prompt, reference["greedy"].shape[1]) for prompt in prompts]
    return EngineRun(key, reference, loaded, prompts, [logits for logits, _ in decoded],
                     [tokens for _, tokens in decoded])


def test_last_position_logits_match_transformers(run):
    for k, (ours, theirs) in enumerate(zip(run.logits, run.reference["logits"])):
        span = float(theirs.max() - theirs.min())
        worst = float(np.abs(ours - theirs).max())
        assert worst <= LOGIT_TOLERANCE * span, (
            f"{run.key} prompt {k}: max |diff| {worst:.3g} is {worst / span:.2e} of the range {span:.3g}")


def test_greedy_continuations_match_transformers(run):
    for k, (ours, theirs) in enumerate(zip(run.greedy, run.reference["greedy"].tolist())):
        differ = [step for step, (a, b) in enumerate(zip(ours, theirs)) if a != b]
        assert ours == theirs, f"{run.key} prompt {k}: the tokens first differ at step {differ[:1]}"


def test_generate_follows_the_greedy_reference_until_it_stops(run):
    """`generate` (chunked prefill, sampler, stop tokens) gives the reference tokens up to its stop."""
    prompt, expected = run.prompts[0], run.reference["greedy"][0].tolist()
    cache = run.loaded.new_cache(len(prompt) + len(expected))
    events = list(generate(run.loaded.model, run.loaded.tokenizer, cache, prompt, SamplingParams.greedy(),
                           max_tokens=len(expected)))
    stops = [step for step, token in enumerate(expected) if token in run.loaded.tokenizer.stop_ids]
    n = stops[0] + 1 if stops else len(expected)
    assert [e.token for e in events] == expected[:n]
    assert events[-1].finish_reason == (FINISH_STOP_TOKEN if stops else FINISH_LENGTH)


def test_tokenization_of_the_perplexity_text_matches_transformers(run):
    text = PPL_TEXT.read_text(encoding="utf-8")
    assert run.loaded.tokenizer.encode(text, add_bos=False) == run.reference["ppl_ids"].tolist()


def test_perplexity_matches_transformers(run):
    result = perplexity(run.loaded, PPL_TEXT.read_text(encoding="utf-8"), ctx=int(run.reference["ppl_ctx"]))
    expected = float(run.reference["ppl"])
    assert result.tokens_scored == int(run.reference["ppl_tokens_scored"])
    assert abs(result.ppl - expected) <= PPL_TOLERANCE * expected, f"{run.key}: {result.ppl} vs {expected}"


# -- Q1_0 --------------------------------------------------------------------------------


def decode_q1_0(blocks: np.ndarray, n_cols: int) -> np.ndarray:
    """Float32 weights of Q1_0 rows: (rows, n_cols / 128 * 18) bytes -> (rows, n_cols).

    Each 18-byte block: an fp16 scale d, then 128 sign bits, least significant bit first;
    a set bit is +d, a clear bit -d.
    """
    rows = blocks.shape[0]
    blocks = blocks.reshape(rows, n_cols // 128, 18)  # (rows, n_blocks, 18)
    d = blocks[..., :2].copy().view(np.float16).astype(np.float32)  # (rows, n_blocks, 1)
    bits = np.unpackbits(blocks[..., 2:], axis=-1, bitorder="little")  # (rows, n_blocks, 128)
    return (d * (bits.astype(np.float32) * 2 - 1)).reshape(rows, n_cols)  # (rows, n_cols)


def write_f32_twin(
    source: Path,
    target: Path,
    extra: dict[str, np.ndarray] | None = None,
    omit: tuple[str, ...] = (),
    metadata: dict | None = None,
) -> None:
    """Copy a GGUF file's metadata and tensors to `target`, Q1_0 tensors decoded to F32, and
    the `extra` tensors after them; without the `omit` tensors, with `metadata`'s values in
    place of the file's (same types)."""
    reader = GGUFReader(source)
    arch = reader.fields["general.architecture"].contents()
    writer = GGUFWriter(target, arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue  # the writer writes these itself
        value_type = GGUFValueType(field.types[0])
        sub_type = GGUFValueType(field.types[-1]) if value_type == GGUFValueType.ARRAY else None
        value = (metadata or {}).get(name, field.contents())
        writer.add_key_value(name, value, value_type, sub_type=sub_type)
    for tensor in reader.tensors:
        if tensor.name in omit:
            continue
        if tensor.tensor_type == GGMLQuantizationType.Q1_0:
            writer.add_tensor(tensor.name, decode_q1_0(np.asarray(tensor.data), int(tensor.shape[0])))
        else:
            writer.add_tensor(tensor.name, np.asarray(tensor.data))
    for name, array in (extra or {}).items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_decode_q1_0_by_hand():
    """The test's own decoder, on one block worked out by hand."""
    block = np.zeros(18, dtype=np.uint8)
    block[:2] = np.frombuffer(np.float16(0.5).tobytes(), dtype=np.uint8)
    block[2] = 0b0000_0101  # weights 0 and 2 positive
    block[17] = 0b1000_0000  # weight 127 positive
    expected = np.full(128, -0.5, dtype=np.float32)
    expected[[0, 2, 127]] = 0.5
    assert np.array_equal(decode_q1_0(block[None, :], 128)[0], expected)


def test_q1_0_qwen3_gives_the_logits_of_its_dequantized_f32_twin(tmp_path):
    twin_path = tmp_path / "tiny-qwen3-q1_0-as-f32.gguf"
    write_f32_twin(TINY_QWEN3_Q1_0, twin_path)
    types = {t.tensor_type for t in GGUFReader(TINY_QWEN3_Q1_0).tensors}
    assert GGMLQuantizationType.Q1_0 in types
    assert {t.tensor_type for t in GGUFReader(twin_path).tensors} == {GGMLQuantizationType.F32}

    prompt = np.asarray([72, 101, 108, 108, 111, 263, 44, 32, 119, 111, 114, 108, 100], dtype=np.int64)
    outputs = []
    for path in (TINY_QWEN3_Q1_0, twin_path):
        loaded = load_model(path, "numpy")
        try:
            cache = loaded.new_cache(64)
            outputs.append(loaded.model.forward(prompt, 0, cache.storage, all_logits=True))  # (T, vocab)
        finally:
            loaded.close()
    q1, f32 = outputs
    assert q1.shape == (len(prompt), 288)
    assert np.abs(q1 - f32).max() <= 1e-4 * np.abs(f32).max()
    assert np.ptp(f32[-1]) > 1.0  # the logits say something: not a constant vector


def test_q1_0_qwen3_generates():
    loaded = load_model(TINY_QWEN3_Q1_0, "numpy")
    try:
        events = list(generate(loaded.model, loaded.tokenizer, loaded.new_cache(64), [72, 101, 108, 108, 111],
                               SamplingParams.greedy(), max_tokens=8))
    finally:
        loaded.close()
    assert 1 <= len(events) <= 8
    assert events[-1].finish_reason in (FINISH_LENGTH, FINISH_STOP_TOKEN)


# -- the command line, end to end ---------------------------------------------------------


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "engine", *args], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def smollm2_reference() -> dict[str, np.ndarray]:
    with np.load(REFERENCE / "smollm2.npz") as data:
        return dict(data)


@pytest.mark.slow
def test_cli_logits_writes_the_reference_vector(tmp_path, smollm2_reference):
    prompt = smollm2_reference["prompt_0"].tolist()
    out = tmp_path / "logits.npy"
    done = run_cli("logits", "--model", "smollm2", "--backend", "numpy", "--tokens", ",".join(map(str, prompt)),
                   "--out", str(out))
    assert done.returncode == 0, done.stderr
    ours, theirs = np.load(out), smollm2_reference["logits"][0]
    assert ours.dtype == np.float32 and ours.shape == theirs.shape
    assert np.abs(ours - theirs).max() <= LOGIT_TOLERANCE * np.ptp(theirs)


@pytest.mark.slow
def test_cli_generate_json(smollm2_reference):
    prompt = smollm2_reference["prompt_0"].tolist()
    done = run_cli("generate", "--model", "smollm2", "--backend", "numpy", "--tokens", ",".join(map(str, prompt)),
                   "--max-tokens", "8", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert set(result) == {"text", "tokens", "finish_reason", "metrics", "backend"}
    assert result["tokens"] == smollm2_reference["greedy"][0][:8].tolist()
    assert result["finish_reason"] == FINISH_LENGTH
    assert result["backend"] == "numpy"
    assert result["metrics"]["decode_tokens"] == 8


@pytest.mark.slow
def test_cli_perplexity_json_of_the_first_window(smollm2_reference):
    done = run_cli("perplexity", "--model", "smollm2", "--backend", "numpy", "--text-file", str(PPL_TEXT),
                   "--max-windows", "1", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert set(result) == {"ppl", "tokens_scored"}
    ctx = int(smollm2_reference["ppl_ctx"])
    assert result["tokens_scored"] == ctx - 1 - ctx // 2
    expected = float(np.exp(smollm2_reference["ppl_window_nll"][0] / result["tokens_scored"]))
    assert abs(result["ppl"] - expected) <= PPL_TOLERANCE * expected


def test_cli_missing_model_file_exits_2_with_one_line(tmp_path):
    missing = tmp_path / "nowhere.gguf"
    done = run_cli("logits", "--model", str(missing), "--tokens", "1,2,3", "--out", str(tmp_path / "x.npy"))
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "nowhere.gguf" in lines[0]
    assert not (tmp_path / "x.npy").exists()
