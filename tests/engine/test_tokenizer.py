"""The tokenizer and the streaming detokenizer, held to llama.cpp.

The reference is tests/fixtures/tokenizer_ids.json: what llama.cpp (llama-cpp-python,
vocab_only) gave for every string of tests/fixtures/tokenizer_corpus.json, recorded by
tools/fixtures/make_tokenizer_fixture.py. Besides the two bundled models it holds vocab-only
variants: SmolLM2's vocabulary under other pre-tokenizer types, Gemma 3's with a space
prefix, and a pre-tokenizer type llama.cpp refuses.
"""

import json
from pathlib import Path

import pytest

from engine.bundled import bundled_model
from engine.detokenizer import IncrementalDetokenizer
from engine.errors import TokenizerError
from engine.gguf_file import open_gguf
from engine.tokenizer import Tokenizer

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CORPUS = json.loads((FIXTURES / "tokenizer_corpus.json").read_text(encoding="utf-8"))
REFERENCE = json.loads((FIXTURES / "tokenizer_ids.json").read_text(encoding="utf-8"))["models"]
LOADABLE = [name for name, ref in REFERENCE.items() if "error" not in ref]
BUNDLED = ["smollm2", "gemma3"]
# how llama_tokenize's (add_special, parse_special) map onto encode's arguments
FLAGS = {
    "plain": {"add_bos": False, "parse_special": False},
    "bos": {"add_bos": None, "parse_special": False},
    "special": {"add_bos": False, "parse_special": True},
    "bos_special": {"add_bos": None, "parse_special": True},
}


@pytest.fixture(scope="module")
def metadata():
    """Model key -> that bundled file's metadata, read once per module."""
    cache = {}

    def get(key: str) -> dict:
        if key not in cache:
            cache[key] = open_gguf(bundled_model(key).path).metadata
        return cache[key]

    return get


def variant_metadata(metadata, name: str) -> dict:
    """A reference entry's metadata: its base model's, with the recorded overrides applied."""
    ref = REFERENCE[name]
    if "base" not in ref:
        return metadata(name)
    changed = dict(metadata(ref["base"]))
    for key, value in ref["overrides"].items():
        if value is None:
            changed.pop(key, None)
        else:
            changed[key] = value
    return changed


@pytest.fixture(scope="module")
def tokenizer(metadata):
    """Reference entry name -> its Tokenizer, built once per module."""
    cache = {}

    def get(name: str) -> Tokenizer:
        if name not in cache:
            cache[name] = Tokenizer.from_metadata(variant_metadata(metadata, name), source=f"{name}.gguf")
        return cache[name]

    return get


def mismatches(tok: Tokenizer, expected: list[list[int]], **flags) -> list[str]:
    found = []
    for text, want in zip(CORPUS, expected, strict=True):
        got = tok.encode(text, **flags)
        if got != want:
            found.append(f"{text[:40]!r}: got {got[:12]}..., llama.cpp {want[:12]}...")
    return found


def test_fixture_covers_the_corpus():
    assert len(CORPUS) >= 40
    assert all(len(REFERENCE[name]["ids"]["plain"]) == len(CORPUS) for name in LOADABLE)
    assert set(BUNDLED) <= set(LOADABLE)


@pytest.mark.parametrize("flag", FLAGS)
@pytest.mark.parametrize("name", LOADABLE)
def test_ids_equal_llama_cpp(tokenizer, name, flag):
    assert mismatches(tokenizer(name), REFERENCE[name]["ids"][flag], **FLAGS[flag]) == []


def test_gpt2_alias_splits_like_gpt_2(metadata):
    tok = Tokenizer.from_metadata({**metadata("smollm2"), "tokenizer.ggml.pre": "gpt2"}, source="alias.gguf")
    assert mismatches(tok, REFERENCE["smollm2-pre-gpt-2"]["ids"]["plain"], add_bos=False) == []


@pytest.mark.parametrize("name", LOADABLE)
def test_special_ids_equal_llama_cpp(tokenizer, name):
    tok, ref = tokenizer(name), REFERENCE[name]
    assert tok.vocab_size == ref["n_tokens"]
    assert (tok.bos_id, tok.eos_id, tok.add_bos) == (ref["bos_id"], ref["eos_id"], ref["add_bos"])
    assert tok.stop_ids == set(ref["eog_ids"])
    assert [i for i in range(tok.vocab_size) if tok.is_special(i)] == ref["control_ids"]


def test_end_of_turn_token(tokenizer):
    # Gemma has one token that looks like an end of turn; llama.cpp agrees
    assert tokenizer("gemma3").eot_id == REFERENCE["gemma3"]["eot_id"] == 106
    # SmolLM2 has two, <|im_end|> (2) and <|endoftext|> (0); llama.cpp takes whichever its
    # hash map lists first (0 here). Sprig takes the first in llama.cpp's list of texts.
    # Both end generation either way.
    smol = tokenizer("smollm2")
    assert smol.eot_id == 2 and REFERENCE["smollm2"]["eot_id"] == 0
    assert {0, 2} <= smol.stop_ids


def test_bundled_special_tokens_by_hand(tokenizer):
    smol, gemma = tokenizer("smollm2"), tokenizer("gemma3")
    assert smol.special_tokens["<|im_start|>"] == 1 and smol.special_tokens["<|im_end|>"] == 2
    assert gemma.special_tokens["<start_of_turn>"] == 105 and gemma.special_tokens["<end_of_turn>"] == 106
    assert gemma.token_text(gemma.bos_id) == "<bos>" and gemma.token_text(gemma.eot_id) == "<end_of_turn>"
    assert not smol.add_bos and gemma.add_bos


def test_unknown_pre_tokenizer_is_refused_like_llama_cpp(metadata):
    ref = REFERENCE["smollm2-pre-unknown"]
    assert "error" in ref  # llama.cpp would not load it either
    with pytest.raises(TokenizerError, match="no-such-pre") as caught:
        Tokenizer.from_metadata(variant_metadata(metadata, "smollm2-pre-unknown"), source="odd.gguf")
    assert "odd.gguf" in str(caught.value)


def test_explicit_add_bos_prepends_bos(tokenizer):
    smol = tokenizer("smollm2")  # its file says not to add BOS
    text = "Hello, world!"
    assert smol.encode(text, add_bos=True) == [smol.bos_id, *smol.encode(text)]


@pytest.mark.parametrize("name", BUNDLED)
def test_decode_equals_llama_cpp_detokenize(tokenizer, name):
    tok, ref = tokenizer(name), REFERENCE[name]
    for ids, plain, special in zip(ref["ids"]["special"], ref["detokenized"]["plain"], ref["detokenized"]["special"]):
        assert tok.decode(ids, skip_special=True) == bytes.fromhex(plain).decode("utf-8", errors="replace")
        assert tok.decode(ids) == bytes.fromhex(special).decode("utf-8", errors="replace")


@pytest.mark.parametrize("name", BUNDLED)
def test_token_bytes_equal_llama_cpp_pieces(tokenizer, name):
    tok = tokenizer(name)
    for token_id, piece in REFERENCE[name]["pieces"].items():
        assert tok.token_bytes(int(token_id)) == bytes.fromhex(piece["plain"]), token_id
        assert tok.token_bytes(int(token_id), special=True) == bytes.fromhex(piece["special"]), token_id


@pytest.mark.parametrize("name", BUNDLED)
def test_decode_inverts_encode(tokenizer, name):
    tok = tokenizer(name)
    # SentencePiece writes spaces as '▁', so a literal '▁' comes back as a space (in llama.cpp too)
    texts = CORPUS if name == "smollm2" else [text for text in CORPUS if "\u2581" not in text]
    for text in texts:
        assert tok.decode(tok.encode(text, add_bos=False)) == text


@pytest.mark.parametrize("name", BUNDLED)
def test_streamed_text_equals_full_decode(tokenizer, name):
    tok = tokenizer(name)
    for ids in REFERENCE[name]["ids"]["bos_special"]:
        detok = IncrementalDetokenizer(tok)
        streamed = "".join(detok.push(i) for i in ids) + detok.flush()
        assert streamed == tok.decode(ids, skip_special=True)


def test_emoji_split_over_byte_level_pieces_waits_for_its_last_byte(tokenizer):
    smol = tokenizer("smollm2")
    ids = REFERENCE["smollm2"]["ids"]["plain"][CORPUS.index("😀")]
    assert len(ids) > 1  # llama.cpp spends several byte-level pieces on it
    detok = IncrementalDetokenizer(smol)
    assert [detok.push(i) for i in ids] == [""] * (len(ids) - 1) + ["😀"]


def test_character_from_byte_tokens_waits_for_its_last_byte(tokenizer):
    gemma = tokenizer("gemma3")
    # U+F0000 (private use) has no token of its own: SentencePiece falls back to its four bytes
    ids = gemma.encode("\U000f0000", add_bos=False)
    assert [gemma.token_text(i) for i in ids] == ["<0xF3>", "<0xB0>", "<0x80>", "<0x80>"]
    detok = IncrementalDetokenizer(gemma)
    assert [detok.push(i) for i in ids] == ["", "", "", "\U000f0000"]


def test_flush_of_a_truncated_character_gives_a_replacement(tokenizer):
    gemma = tokenizer("gemma3")
    ids = gemma.encode("a\U000f0000", add_bos=False)
    detok = IncrementalDetokenizer(gemma)
    assert "".join(detok.push(i) for i in ids[:-2]) == "a"
    assert detok.flush() == "\ufffd"


def test_detokenizer_skips_control_tokens_unless_asked(tokenizer):
    smol = tokenizer("smollm2")
    ids = smol.encode("<|im_start|>hi<|im_end|>", parse_special=True)
    assert "".join(map(IncrementalDetokenizer(smol).push, ids)) == "hi"
    keep = IncrementalDetokenizer(smol, skip_special=False)
    assert "".join(map(keep.push, ids)) == "<|im_start|>hi<|im_end|>"


SMALL_BPE = {
    "tokenizer.ggml.model": "gpt2",
    "tokenizer.ggml.pre": "gpt-2",
    "tokenizer.ggml.tokens": ["a", "b", "ab"],
    "tokenizer.ggml.merges": ["a b"],
}


@pytest.mark.parametrize(("change", "words"), [
    ({"tokenizer.ggml.tokens": None}, ["tokenizer.ggml.tokens"]),
    ({"tokenizer.ggml.tokens": []}, ["tokenizer.ggml.tokens"]),
    ({"tokenizer.ggml.model": None}, ["tokenizer.ggml.model"]),
    ({"tokenizer.ggml.model": "rwkv"}, ["'rwkv'"]),
    ({"tokenizer.ggml.merges": None}, ["merge", "tokenizer.ggml.merges"]),
    ({"tokenizer.ggml.merges": [1, 2]}, ["tokenizer.ggml.merges", "list of strings"]),
    ({"tokenizer.ggml.pre": "no-such-pre"}, ["'no-such-pre'"]),
    ({"tokenizer.ggml.tokens": ["a", "b", "a"]}, ["same token text twice"]),
    ({"tokenizer.ggml.token_type": [1, 1]}, ["tokenizer.ggml.token_type", "2 entries for 3 tokens"]),
])
def test_broken_vocabularies_raise_tokenizer_error(change, words):
    metadata = {key: value for key, value in {**SMALL_BPE, **change}.items() if value is not None}
    with pytest.raises(TokenizerError) as caught:
        Tokenizer.from_metadata(metadata, source="broken.gguf")
    message = str(caught.value)
    assert "broken.gguf" in message
    assert all(word in message for word in words), message


def test_small_bpe_merges_by_hand():
    tok = Tokenizer.from_metadata(SMALL_BPE, source="small.gguf")
    assert tok.encode("abab ba") == [2, 2, 1, 0]  # " " has no token: llama.cpp drops it
    assert tok.decode([2, 0]) == "aba"
