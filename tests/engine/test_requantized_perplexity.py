"""The bundled models re-quantized by llama.cpp into each quant type, read in place on cpu.

For each type, llama.cpp's quantizer (llama-cpp-python's `llama_model_quantize`, through
tools/fixtures/requantize.py in the peer venv) writes SmolLM2 (and Gemma-3-270M, for a subset: its
262k-token vocabulary makes each pass slow) in that type, with an importance matrix measured
by tools/fixtures/make_imatrix.py. Then, over 8 windows of 128 tokens of tests/fixtures/ppl_text.txt
(with 2 or 4 windows, the figures moved by noise near the bounds from one environment's
files to another's: SmolLM2's IQ1_M at +0.62% and +1.05% against NumPy over 2 windows, its
IQ4_XS 2.01% from llama.cpp over 4, where llama.cpp's own was 1.99% from NumPy; over 8, +0.23%
and -0.10% / 0.48%, with the kernels exact to their activation rounding throughout):

- the file holds tensors of the type (llama.cpp falls back to another type where a row does
  not split into its blocks: both models' hidden sizes, 576 and 640, are no multiple of 256,
  so the 256-weight types are in ffn_down and the others fall back; Q2_K comes from the
  Q2_K_S mix, Q3_K from Q3_K_S, as llama.cpp's Q2_K and Q3_K_M mixes give ffn_down more bits);
- the cpu backend loads it without converting anything (no load note);
- its perplexity is within 1% of NumPy's on the same file and within 2% of llama.cpp's, both
  with each window fed at once (a prefill) and 16 tokens at a time. Both quantize the
  activations (int16 codes; 8-bit ones with a scale per group for Q2_K, Q3_K and the IQ types
  but IQ4_NL), except the prefills of the 32-weight types, which take them as floats.

Left out, with what covers them instead (tests/backends/test_cpu_kernels.py: unpacking equal
to gguf-py's, every tier equal to scalar, products within the rounding bound):
- TQ1_0 and TQ2_0: these models were not trained ternary, and in ternary they are noise
  (perplexity 4e5 for SmolLM2, 1e10 for Gemma), so sensitive that two llama.cpp builds gave
  4e5 and 6.5e5 on the same file: no perplexity bound would say anything about the kernels.
- IQ2_S: llama.cpp's IQ2_S mix writes SmolLM2's ffn_down (its only tensors whose rows split
  into 256-value blocks) as IQ2_XS and IQ3_S, so no file holds it.
- Gemma in all but Q3_K and IQ4_XS: its 262k-token vocabulary makes the importance matrix
  and each perplexity pass slow, and the types run through the same kernels as SmolLM2's.

MXFP4 is left out: llama.cpp writes it only for experts (MXFP4_MOE), and these are dense.
Without a Python that has llama-cpp-python ($SPRIG_PEER_PYTHON, .venv-peer: `make peer-venv`)
the tests skip, saying why.
"""

import json
import subprocess
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType as T

from engine.bundled import resolve_model_path
from engine.loader import load_model
from engine.perplexity import perplexity
from tools.fixtures.make_imatrix import importance_matrix

ROOT = Path(__file__).resolve().parent.parent.parent
PPL_TEXT = (ROOT / "tests" / "fixtures" / "ppl_text.txt").read_text()
CTX, WINDOWS = 128, 8
# llama.cpp file type -> the tensor type it writes where the rows allow
SMOLLM2_TYPES = {
    "Q2_K_S": T.Q2_K,
    "Q3_K_S": T.Q3_K,
    "IQ4_NL": T.IQ4_NL,
    "IQ4_XS": T.IQ4_XS,
    "IQ3_XXS": T.IQ3_XXS,
    "IQ3_S": T.IQ3_S,
    "IQ2_XXS": T.IQ2_XXS,
    "IQ2_XS": T.IQ2_XS,
    "IQ1_S": T.IQ1_S,
    "IQ1_M": T.IQ1_M,
}
GEMMA_TYPES = ("Q3_K_S", "IQ4_XS")
CASES = [("smollm2", f) for f in SMOLLM2_TYPES] + [("gemma3", f) for f in GEMMA_TYPES]


@pytest.fixture(scope="module")
def imatrices(tmp_path_factory):
    """{model key: .npz importance matrix}, measured once per model when first asked for."""
    folder, made = tmp_path_factory.mktemp("imatrix"), {}

    def get(key: str) -> Path:
        if key not in made:
            import numpy as np

            made[key] = folder / f"{key}.npz"
            np.savez(made[key], **importance_matrix(resolve_model_path(key), PPL_TEXT, CTX, WINDOWS))
        return made[key]

    return get


@pytest.mark.parametrize(("key", "ftype"), CASES, ids=[f"{k}-{f}" for k, f in CASES])
def test_requantized_model_matches_numpy_and_llama_cpp(key, ftype, peer, imatrices, tmp_path):
    source = resolve_model_path(key)
    path = tmp_path / f"{key}-{ftype}.gguf"
    subprocess.run(
        [peer, str(ROOT / "tools" / "fixtures" / "requantize.py"), str(source), str(path), ftype,
         "--imatrix", str(imatrices(key))],
        check=True,
        capture_output=True,
    )
    cpu, numpy = load_model(path, "cpu"), load_model(path, "numpy")
    try:
        types = {info.ggml_type for info in cpu.file.tensors.values()}
        assert int(SMOLLM2_TYPES[ftype]) in types, sorted(T(t).name for t in types)
        assert cpu.load_notes == [], cpu.load_notes
        ours = perplexity(cpu, PPL_TEXT, ctx=CTX, max_windows=WINDOWS).ppl
        ours_in_steps = perplexity(cpu, PPL_TEXT, ctx=CTX, max_windows=WINDOWS, chunk=16).ppl
        reference = perplexity(numpy, PPL_TEXT, ctx=CTX, max_windows=WINDOWS).ppl
        tokens = cpu.tokenizer.encode(PPL_TEXT, add_bos=False)
        bos = cpu.tokenizer.bos_id if cpu.tokenizer.add_bos else None
    finally:
        cpu.close()
        numpy.close()
    request = tmp_path / "tokens.json"
    request.write_text(json.dumps({"tokens": tokens, "bos": bos}))
    result = subprocess.run(
        [
            peer,
            str(ROOT / "tools" / "fixtures" / "requantize.py"),
            str(path),
            "--perplexity",
            str(request),
            "--ctx",
            str(CTX),
            "--windows",
            str(WINDOWS),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    llama = json.loads(result.stdout.strip().splitlines()[-1])["ppl"]
    print(f"{key} {ftype}: cpu {ours:.4f} (16 at a time {ours_in_steps:.4f}), numpy {reference:.4f}, llama.cpp {llama:.4f}")
    for got in (ours, ours_in_steps):
        assert abs(got / reference - 1.0) <= 0.01, (got, reference)
        assert abs(got / llama - 1.0) <= 0.02, (got, llama)
