"""Record llama.cpp's token ids for the tokenizer corpus: tests/fixtures/tokenizer_ids.json.

llama.cpp (through llama-cpp-python, loaded with vocab_only) is the reference that
tests/engine/test_tokenizer.py holds engine/tokenizer.py to. For each vocabulary and each
string of tests/fixtures/tokenizer_corpus.json it records the ids of `llama_tokenize` with
add_special and parse_special each off and on, the detokenized bytes, and the vocabulary's
BOS/EOS/EOT ids, add-BOS flag and end-of-generation ids.

Besides the two bundled models, it writes vocab-only GGUF variants to a temporary folder:
SmolLM2's vocabulary under the other pre-tokenizer types (gpt-2, qwen2, llama-bpe, default,
none, and an unknown one), a tiny llama-bpe vocabulary with a token that no merge reaches,
and Gemma 3's vocabulary with a space prefix. Those exercise the pre-tokenizer regexes,
whole-word lookup and the SentencePiece space prefix that the bundled files do not use.
A variant that llama.cpp refuses to load is recorded with its error.

Run it with the reference venv, which has llama-cpp-python and gguf:

    path() { .venv/bin/python -c "from engine.bundled import bundled_model; print(bundled_model('$1').path)"; }
    /work/refvenv/bin/python tools/make_tokenizer_fixture.py --smollm2 "$(path smollm2)" --gemma3 "$(path gemma3)"
"""

import argparse
import ctypes
import json
import tempfile
from pathlib import Path

import gguf
import llama_cpp

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "fixtures" / "tokenizer_corpus.json"
OUTPUT = ROOT / "tests" / "fixtures" / "tokenizer_ids.json"

# (name, base model, tokenizer keys to override; None removes the key)
VARIANTS = [
    ("smollm2-pre-gpt-2", "smollm2", {"tokenizer.ggml.pre": "gpt-2"}),
    ("smollm2-pre-qwen2", "smollm2", {"tokenizer.ggml.pre": "qwen2"}),
    ("smollm2-pre-llama-bpe", "smollm2", {"tokenizer.ggml.pre": "llama-bpe", "tokenizer.ggml.add_bos_token": None}),
    ("smollm2-pre-default", "smollm2", {"tokenizer.ggml.pre": "default"}),
    ("smollm2-pre-missing", "smollm2", {"tokenizer.ggml.pre": None}),
    ("smollm2-pre-unknown", "smollm2", {"tokenizer.ggml.pre": "no-such-pre"}),
    ("gemma3-space-prefix", "gemma3", {"tokenizer.ggml.add_space_prefix": True, "tokenizer.ggml.add_bos_token": None}),
]
# ids whose pieces are recorded, besides BOS/EOS/EOT
PIECE_IDS = {
    "smollm2": [*range(0, 20), 198, 216, 5248],
    "gemma3": [*range(0, 8), 105, 106, 107, 168, 212, 238, 248, 400, 255968],
}
PIECE_IDS["tiny-llama-bpe"] = [0, 1, 2, 100, -3, -2, -1]  # negative: from the end


def tiny_vocabulary(smollm2: Path) -> dict:
    """Overrides that turn SmolLM2's file into a tiny llama-bpe vocabulary.

    ' quick' is a token there that no merge reaches: llama-bpe looks whole words up before
    merging (ignore_merges), so it comes out as one token, where plain BPE would give four.
    """
    tokens = gguf.GGUFReader(smollm2).fields["tokenizer.ggml.tokens"].contents()
    byte_chars = [t for t in tokens if len(t) == 1]  # GPT-2's 256 byte characters
    tiny = ["<|begin_of_text|>", "<|eot_id|>", *byte_chars, "Ġq", "Ġqu", "Ġquick"]
    return {
        "tokenizer.ggml.pre": "llama-bpe",
        "tokenizer.ggml.tokens": tiny,
        "tokenizer.ggml.token_type": [3, 3] + [1] * (len(tiny) - 2),
        "tokenizer.ggml.merges": ["Ġ q", "Ġq u"],
        "tokenizer.ggml.bos_token_id": 0,
        "tokenizer.ggml.eos_token_id": 1,
        "tokenizer.ggml.unknown_token_id": None,
        "tokenizer.ggml.padding_token_id": None,
        "tokenizer.ggml.add_bos_token": None,
        "tokenizer.chat_template": None,
        "llama.vocab_size": None,
    }


def write_variant(base: Path, overrides: dict, path: Path) -> None:
    """Copy `base`'s metadata (no tensors) into a vocab-only GGUF, with `overrides` applied."""
    reader = gguf.GGUFReader(base)
    writer = gguf.GGUFWriter(path, arch=reader.fields["general.architecture"].contents())
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        value = overrides.get(name, field.contents())
        if value is not None:  # an override keeps the key's type in the base file
            sub_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(name, value, field.types[0], sub_type=sub_type)
    for name, value in overrides.items():
        if name not in reader.fields and value is not None:
            writer.add_key_value(name, value, gguf.GGUFValueType.get_type(value))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def detokenize(vocab, ids: list[int], special: bool) -> bytes:
    """llama.cpp's own `llama_detokenize` (llama-cpp-python's wrapper cuts pieces at 32 bytes)."""
    tokens = (llama_cpp.llama_token * len(ids))(*ids)
    size = 64 * len(ids) + 64
    text = ctypes.create_string_buffer(size)
    n = llama_cpp.llama_detokenize(vocab, tokens, len(ids), text, size, False, special)
    assert n >= 0, "buffer too small"
    return text.raw[:n]


def record(path: Path, corpus: list[str], piece_ids: list[int]) -> dict:
    """Everything the tests compare for one vocabulary."""
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    n_tokens = llama_cpp.llama_vocab_n_tokens(vocab)

    def token_id(value: int) -> int | None:
        return None if value == llama_cpp.LLAMA_TOKEN_NULL else value

    ids = {}
    for name, add_special, parse_special in (("plain", False, False), ("bos", True, False),
                                             ("special", False, True), ("bos_special", True, True)):
        ids[name] = [llm.tokenize(text.encode(), add_bos=add_special, special=parse_special) for text in corpus]
    special = {token_id(t) for t in (llama_cpp.llama_vocab_bos(vocab), llama_cpp.llama_vocab_eos(vocab),
                                     llama_cpp.llama_vocab_eot(vocab))} - {None}
    pieces = {str(i): {"plain": detokenize(vocab, [i], False).hex(), "special": detokenize(vocab, [i], True).hex()}
              for i in sorted({*(i % n_tokens for i in piece_ids), *special})}
    return {
        "n_tokens": n_tokens,
        "bos_id": token_id(llama_cpp.llama_vocab_bos(vocab)),
        "eos_id": token_id(llama_cpp.llama_vocab_eos(vocab)),
        "eot_id": token_id(llama_cpp.llama_vocab_eot(vocab)),
        "add_bos": bool(llama_cpp.llama_vocab_get_add_bos(vocab)),
        "eog_ids": [i for i in range(n_tokens) if llama_cpp.llama_vocab_is_eog(vocab, i)],
        "control_ids": [i for i in range(n_tokens) if llama_cpp.llama_vocab_is_control(vocab, i)],
        "ids": ids,
        # the text of each string's special-parsed ids, rendered without and with control tokens
        "detokenized": {
            "plain": [detokenize(vocab, t, False).hex() for t in ids["special"]],
            "special": [detokenize(vocab, t, True).hex() for t in ids["special"]],
        },
        "pieces": pieces,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smollm2", type=Path, required=True, help="SmolLM2-135M-Instruct GGUF file")
    parser.add_argument("--gemma3", type=Path, required=True, help="Gemma-3-270M GGUF file")
    args = parser.parse_args()
    corpus = json.loads(CORPUS.read_text(encoding="utf-8"))
    bases = {"smollm2": args.smollm2, "gemma3": args.gemma3}
    fixture = {"corpus_size": len(corpus), "models": {}}
    for name, path in bases.items():
        print("recording", name)
        fixture["models"][name] = record(path, corpus, PIECE_IDS[name])
    variants = [*VARIANTS, ("tiny-llama-bpe", "smollm2", tiny_vocabulary(args.smollm2))]
    with tempfile.TemporaryDirectory() as tmp:
        for name, base, overrides in variants:
            print("recording", name)
            path = Path(tmp) / f"{name}.gguf"
            write_variant(bases[base], overrides, path)
            try:
                entry = record(path, corpus, PIECE_IDS.get(name, PIECE_IDS[base]))
            except ValueError as exc:  # llama-cpp-python's "Failed to load model from file"
                entry = {"error": str(exc).replace(str(path), path.name)}  # its log says why
            fixture["models"][name] = {"base": base, "overrides": overrides, **entry}
    OUTPUT.write_text(json.dumps(fixture, ensure_ascii=False, separators=(",", ":")) + "\n", encoding="utf-8")
    print("wrote", OUTPUT)


if __name__ == "__main__":
    main()
