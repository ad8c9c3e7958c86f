"""File names to quantizations, split files as one model, fit verdicts and the recommended pick."""

import pytest

from engine.hub.files import GGUFChoice, RemoteFile, group_files, quant_of
from engine.hub.fit import FITS, TIGHT, WONT_FIT, bits_per_weight, estimated_parameters, judge, recommended_choice


@pytest.mark.parametrize(
    ("path", "quant"),
    [
        ("Qwen3-4B-Q4_K_M.gguf", "Q4_K_M"),
        ("qwen2.5-coder-7b-instruct-q4_k_m-00001-of-00002.gguf", "Q4_K_M"),
        ("Meta-Llama-3-8B-Instruct.Q8_0.gguf", "Q8_0"),
        ("gemma-3-1b-it-BF16.gguf", "BF16"),
        ("Qwen3-30B-A3B-UD-IQ2_XXS.gguf", "IQ2_XXS"),
        ("Q5_K_M/Model-00001-of-00003.gguf", "Q5_K_M"),
        ("Bonsai-8B.gguf", "?"),
    ],
)
def test_the_quantization_is_read_from_the_name(path, quant):
    assert quant_of(path) == quant


def file(path: str, size: int) -> RemoteFile:
    return RemoteFile(path, size, "0" * 64, None)


def test_split_parts_are_one_choice_and_projectors_are_left_out():
    choices = group_files(
        [
            file("m-Q8_0-00002-of-00002.gguf", 5),
            file("m-Q8_0-00001-of-00002.gguf", 7),
            file("m-Q4_K_M.gguf", 6),
            file("mmproj-m-F16.gguf", 1),
            file("README.md", 1),
        ]
    )
    assert [(c.quant, [p.path for p in c.parts], c.size) for c in choices] == [
        ("Q4_K_M", ["m-Q4_K_M.gguf"], 6),
        ("Q8_0", ["m-Q8_0-00001-of-00002.gguf", "m-Q8_0-00002-of-00002.gguf"], 12),
    ]


def test_verdict_levels():
    assert judge(800, 1000, estimated=False).level == FITS
    assert judge(801, 1000, estimated=False).level == TIGHT
    assert judge(1000, 1000, estimated=True).level == TIGHT
    assert judge(1001, 1000, estimated=True).level == WONT_FIT


def test_parameters_are_estimated_from_size_and_quantization():
    assert bits_per_weight("Q4_K_M") == 4.5 and bits_per_weight("Q1_0") == 1.125
    assert estimated_parameters(GGUFChoice("Q8_0", (file("x-Q8_0.gguf", 8_500_000_000),))) == 8_000_000_000


def test_the_pick_is_the_largest_comfortable_file_up_to_q4_k_m():
    sizes = {"Q2_K": 2, "Q3_K_M": 3, "Q4_K_M": 4, "Q6_K": 6, "Q8_0": 8}
    choices = tuple(GGUFChoice(q, (file(f"m-{q}.gguf", s),)) for q, s in sizes.items())

    def pick(free: int) -> str | None:
        fits = {c: judge(c.size, free, estimated=False) for c in choices}
        chosen = recommended_choice(choices, fits)
        return chosen.quant if chosen else None

    assert pick(100) == "Q4_K_M"  # room for Q8_0 too, but Q4_K_M is the default
    assert pick(4) == "Q3_K_M"  # Q4_K_M would only just fit: the largest comfortable one below it
    assert pick(2) is None  # nothing fits with room to spare
    no_default = tuple(c for c in choices if c.quant != "Q4_K_M")
    fits = {c: judge(c.size, 100, estimated=False) for c in no_default}
    assert recommended_choice(no_default, fits).quant == "Q8_0"
