"""The tokenizer, built from a GGUF file's vocabulary so that its ids equal llama.cpp's.

A GGUF file names its vocabulary format in `tokenizer.ggml.model`. Three are supported:

- `gpt2`: byte-level BPE. The text is first cut into words by the regexes that llama.cpp
  uses for the file's `tokenizer.ggml.pre`; each word is mapped to GPT-2's printable byte
  characters and merged by the ranks in `tokenizer.ggml.merges`.
- `llama`: SentencePiece-style vocabularies (Llama 2, Gemma). llama.cpp starts from single
  characters and keeps joining the adjacent pair whose joined text is the highest-scoring
  token of the vocabulary; characters that no token covers become <0xXX> byte tokens. A BPE
  whose merge list holds every split of every token, ranked by that token's score, makes
  the same choices, so both formats run on the `tokenizers` library's BPE model.
- `gemma4`: Gemma 4's BPE over raw UTF-8 (no byte mapping), spaces written as '▁', the text
  cut only between runs of newlines and the rest, merged by the ranks in
  `tokenizer.ggml.merges`; a character no token covers becomes its <0xXX> byte tokens. As
  llama.cpp, a prompt always starts with BOS.
- `bert`: BERT's WordPiece (llama.cpp's WPM). The file stores a word's first piece with a
  leading '▁' and its continuations bare; the `tokenizers` library's WordPiece model takes
  them bare and with '##', after BERT's normalizer (lowercase, accents stripped, where the
  file says `tokenizer.ggml.normalizer.lowercase`, as llama.cpp by default) and pre-tokenizer.

Special tokens follow llama.cpp. Control and unknown tokens are cut out of the text only
when `parse_special` is on; otherwise their text is tokenized like any other text.
User-defined tokens (Gemma's runs of spaces, tabs and newlines, its HTML tags) are always
cut out. Tokens whose text marks the end of a turn (`<|im_end|>`, `<end_of_turn>`, ...)
count as control tokens and end generation, as in llama.cpp.

Known limits, none of which the bundled vocabularies meet: the file's add-EOS flag is not
applied (a chat prompt never ends in EOS); llama.cpp's per-model whitespace stripping around
a few special tokens (Phi-3, Jina) is not reproduced; where two special tokens overlap in
the text, the library takes the leftmost, llama.cpp the longest; and among SentencePiece
tokens of equal score, ties go by token id here, by position in llama.cpp.
"""

import re
import threading
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import tokenizers
from tokenizers import AddedToken, Regex, models, normalizers, pre_tokenizers

from engine.errors import TokenizerError

# tokenizer.ggml.token_type values (5, unused, and anything else render as nothing)
TYPE_NORMAL = 1
TYPE_UNKNOWN = 2
TYPE_CONTROL = 3
TYPE_USER_DEFINED = 4
TYPE_BYTE = 6

SPM_SPACE = "\u2581"  # '▁', SentencePiece's visible space

# The word-splitting regexes of llama.cpp's BPE tokenizer (src/llama-vocab.cpp), applied
# one after the other, each cutting the pieces the previous one left.
_GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3_REGEX = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_REGEX = _LLAMA3_REGEX.replace(r"\p{N}{1,3}", r"\p{N}")
# Qwen3.5: Qwen2's, letters joined by their combining marks (\p{M})
_QWEN35_REGEX = _QWEN2_REGEX.replace(r"\p{L}+", r"[\p{L}\p{M}]+").replace(
    r" ?[^\s\p{L}\p{N}]+", r" ?[^\s\p{L}\p{M}\p{N}]+"
)
# o200k (gpt-oss, Llama 4): the tokenizer.json original, which llama.cpp rewrites without (?i:)
_CASE = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]"
_LOWER = r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
_SUFFIX = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
_GPT4O_REGEX = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_CASE}*{_LOWER}+{_SUFFIX}|[^\r\n\p{{L}}\p{{N}}]?{_CASE}+{_LOWER}*{_SUFFIX}"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_SPLIT_REGEXES = {
    "default": (r"[\p{P}\$\+<=>\^~\|]+", _GPT2_REGEX, r"\p{N}+", r"[0-9][0-9][0-9]"),
    "gpt2": (_GPT2_REGEX,),
    "starcoder": (r"\p{N}", _GPT2_REGEX),
    "llama3": (_LLAMA3_REGEX,),
    "qwen2": (_QWEN2_REGEX,),
    "qwen35": (_QWEN35_REGEX,),
    "gpt4o": (_GPT4O_REGEX,),
}


def _pre_types() -> dict[str, tuple[str, bool, bool]]:
    """`tokenizer.ggml.pre` value -> (regex set, ignore_merges, add-BOS default), as in llama.cpp."""
    groups = {
        ("default", False, False): ["default"],
        ("gpt2", False, False): [
            "gpt-2",
            "phi-2",
            "jina-es",
            "jina-de",
            "gigachat",
            "jina-v2-es",
            "jina-v2-de",
            "a.x-4.0",
            "mellum",
            "modern-bert",
            "mpt",
            "olmo",
            "jais",
            "exaone4",
            "trillion",
            "granite-docling",
            "gpt2",  # not a llama.cpp name (it writes "gpt-2"); accepted as the obvious alias
        ],
        ("starcoder", False, False): [
            "starcoder",
            "refact",
            "command-r",
            "smollm",
            "codeshell",
            "exaone",
            "minerva-7b",
            "mellum2",
        ],
        ("llama3", True, True): [
            "llama3",
            "llama-v3",
            "llama-bpe",
            "falcon3",
            "falcon-h1",
            "pixtral",
            "midm-2.0",
            "lfm2",
            "jina-v5-nano",
        ],
        ("llama3", False, False): ["dbrx", "smaug-bpe"],
        ("gpt4o", False, False): ["gpt-4o", "llama4", "kanana2"],
        ("qwen35", False, False): ["qwen35"],
        ("qwen2", False, False): [
            "qwen2",
            "deepseek-r1-qwen",
            "kormo",
            "f2llmv2",
            "megrez",
            "stablelm2",
            "hunyuan",
        ],
    }
    return {name: settings for settings, names in groups.items() for name in names}


_PRE_TYPES = _pre_types()

# llama.cpp finds these tokens by their text when the file does not name them, and then
# treats them as control tokens. Here the first text of a list that the vocabulary has wins;
# llama.cpp takes the first its hash map yields (for SmolLM2's EOT, <|endoftext|> rather
# than <|im_end|>). Both end generation either way.
_EOT_TEXTS = (
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
)
_EOM_TEXTS = ("<|eom_id|>",)
_FIM_PAD_TEXTS = ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]")
_FIM_REP_TEXTS = ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>")
_FIM_SEP_TEXTS = ("<|file_sep|>",)
_FIM_PRE_TEXTS = (
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<｜fim▁begin｜>",
    "<PRE>",
    "▁<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
)
_FIM_SUF_TEXTS = (
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<｜fim▁hole｜>",
    "<SUF>",
    "▁<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
)
_FIM_MID_TEXTS = (
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<｜fim▁end｜>",
    "<MID>",
    "▁<MID>",
    "<|code_middle|>",
    "<|middle|>",
)
# In OpenAI's harmony format (gpt-oss) an answer ends with <|return|> or <|call|>; its
# <|end|> ends one message of several.
_HARMONY_TURN_ENDS = ("<|return|>", "<|call|>", "<|end|>")
# Every token with one of these texts ends generation.
_EOG_TEXTS = (
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
)


def _gpt2_byte_chars() -> dict[str, int]:
    """GPT-2's byte-level alphabet: the printable character that stands for each byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = {chr(b): b for b in printable}
    others = (b for b in range(256) if b not in printable)
    chars.update({chr(256 + n): b for n, b in enumerate(others)})
    return chars


_GPT2_BYTES = _gpt2_byte_chars()


class Tokenizer:
    """Text <-> token ids for one GGUF vocabulary, with the same ids as llama.cpp.

    Build it with `Tokenizer.from_metadata`. Attributes: `vocab_size`, `bos_id`, `eos_id`,
    `eot_id` (None where the vocabulary has none), `add_bos` (whether a prompt starts with
    BOS), `stop_ids` (every token that ends generation) and `special_tokens` (text -> id of
    the control, unknown and user-defined tokens).
    """

    def __init__(self, vocab: "_Vocabulary", hf: tokenizers.Tokenizer, add_bos: bool, source: str):
        self._hf = hf
        self._hf_lock = threading.Lock()  # encode_special_tokens is state on a shared object
        self._tokens = vocab.tokens
        self._types = vocab.types
        self._byte_level = vocab.model == "gpt2"
        self._add_space_prefix = vocab.add_space_prefix
        self._pieces: dict[int, bytes] = {}
        self._source = source
        self.vocab_size = len(vocab.tokens)
        self.bos_id = vocab.ids["bos"]
        self.eos_id = vocab.ids["eos"]
        self.eot_id = vocab.ids["eot"]
        self.add_bos = add_bos
        self.stop_ids = vocab.stop_ids
        matched = np.flatnonzero(np.isin(vocab.types, (TYPE_CONTROL, TYPE_UNKNOWN, TYPE_USER_DEFINED)))
        self.special_tokens = {vocab.tokens[i]: int(i) for i in matched}

    @classmethod
    def from_metadata(cls, metadata: dict, source: str) -> "Tokenizer":
        """Build the tokenizer from a GGUF file's metadata (key -> plain Python value).

        `source` names the file in error messages. Raises TokenizerError when the vocabulary
        is missing, malformed, or of a kind that llama.cpp would not load either.
        """
        vocab = _Vocabulary(metadata, source)
        if vocab.model == "gpt2":
            hf, add_bos_default = _byte_level_bpe(vocab, metadata, source)
        elif vocab.model == "gemma4":
            hf, add_bos_default = _gemma4_bpe(vocab, metadata, source), True
        elif vocab.model == "bert":
            hf, add_bos_default = _wordpiece(vocab, metadata, source), True
        else:
            hf, add_bos_default = _sentencepiece_bpe(vocab), True
        add_bos = _optional(metadata, "tokenizer.ggml.add_bos_token", bool, add_bos_default, source)
        add_bos = add_bos or vocab.model == "gemma4"  # llama.cpp turns it on for Gemma 4 whatever the file says
        if add_bos and vocab.ids["bos"] is None:
            raise TokenizerError(
                f"{source}: the vocabulary asks for a BOS token but names none. "
                "The file is damaged or was converted wrongly; re-download or re-convert it."
            )
        _add_special_tokens(hf, vocab)
        return cls(vocab, hf, add_bos, source)

    def encode(self, text: str, *, add_bos: bool | None = None, parse_special: bool = False) -> list[int]:
        """Token ids of `text`, as llama.cpp's `llama_tokenize` gives them.

        `add_bos` None follows the file's add-BOS flag. With `parse_special`, the text of a
        control token (`<|im_start|>`, `<start_of_turn>`) becomes that token; without it,
        such text is tokenized as plain text. User-defined tokens are always matched.
        """
        if add_bos is None:
            add_bos = self.add_bos
        bos = self.bos_id if add_bos else None
        if add_bos and bos is None:
            raise TokenizerError(f"{self._source}: this vocabulary has no BOS token to add.")
        with self._hf_lock:
            self._hf.encode_special_tokens = not parse_special
            ids = self._hf.encode(text, add_special_tokens=False).ids
        return ids if bos is None else [bos, *ids]

    def decode(self, ids: Iterable[int], *, skip_special: bool = False) -> str:
        """The text of `ids`. With `skip_special`, control tokens (BOS, `<end_of_turn>`) give nothing.

        Bytes that do not form valid UTF-8 become U+FFFD. Where the vocabulary adds a space
        before the text (`tokenizer.ggml.add_space_prefix`), the first token loses it again.
        """
        pieces = [self.token_bytes(i, special=not skip_special) for i in ids]
        if self._add_space_prefix and pieces and pieces[0].startswith(b" "):
            pieces[0] = pieces[0][1:]
        return b"".join(pieces).decode("utf-8", errors="replace")

    def token_bytes(self, token_id: int, *, special: bool = False) -> bytes:
        """The raw bytes that one token stands for, as llama.cpp's `llama_token_to_piece`.

        Control and unknown tokens give b"" unless `special` is set, when they give their
        text. A byte token may be one byte of a longer UTF-8 character.
        """
        self._check_id(token_id)
        kind = int(self._types[token_id])
        if kind in (TYPE_CONTROL, TYPE_UNKNOWN):
            return self._tokens[token_id].encode() if special else b""
        piece = self._pieces.get(token_id)
        if piece is None:
            piece = self._pieces[token_id] = self._piece(kind, self._tokens[token_id])
        return piece

    def token_text(self, token_id: int) -> str:
        """The text of a token as the vocabulary stores it (byte-level or '▁' form)."""
        self._check_id(token_id)
        return self._tokens[token_id]

    def is_special(self, token_id: int) -> bool:
        """Whether a token is a control or unknown token (BOS, EOS, `<|im_start|>`, ...)."""
        self._check_id(token_id)
        return int(self._types[token_id]) in (TYPE_CONTROL, TYPE_UNKNOWN)

    def _piece(self, kind: int, text: str) -> bytes:
        if kind == TYPE_USER_DEFINED:
            return text.encode()
        if kind == TYPE_BYTE:
            return bytes.fromhex(text[3:5])
        if kind == TYPE_NORMAL:
            return self._unmap(text) if self._byte_level else text.replace(SPM_SPACE, " ").encode()
        return b""  # unused and undefined tokens render as nothing

    @staticmethod
    def _unmap(text: str) -> bytes:
        # a character outside GPT-2's alphabet is kept as it is (llama.cpp marks it [UNK_BYTE_..])
        return b"".join(bytes([_GPT2_BYTES[c]]) if c in _GPT2_BYTES else c.encode() for c in text)

    def _check_id(self, token_id: int) -> None:
        if not 0 <= token_id < self.vocab_size:
            raise TokenizerError(
                f"{self._source}: token id {token_id} is outside the vocabulary (0..{self.vocab_size - 1})."
            )


class _Vocabulary:
    """The tokenizer.ggml.* keys of one file, checked, with llama.cpp's defaults filled in."""

    def __init__(self, metadata: dict, source: str):
        model = metadata.get("tokenizer.ggml.model")
        if model is None:
            raise TokenizerError(
                f"{source}: the file has no tokenizer (the key tokenizer.ggml.model is missing), "
                "so Sprig cannot turn text into tokens for it. Use a GGUF file that includes its vocabulary."
            )
        if model not in ("gpt2", "llama", "gemma4", "bert"):
            raise TokenizerError(
                f"{source}: its vocabulary is of type {model!r}, which Sprig does not support. "
                "Sprig reads byte-level BPE ('gpt2'), SentencePiece ('llama'), Gemma 4 ('gemma4') and "
                "WordPiece ('bert') vocabularies."
            )
        self.model = model
        self.tokens = _token_texts(metadata, source)
        self.token_ids = {text: i for i, text in enumerate(self.tokens)}
        n = len(self.tokens)
        if len(self.token_ids) != n:
            raise TokenizerError(
                f"{source}: its vocabulary lists the same token text twice, which llama.cpp refuses too. "
                "The file is damaged; re-download or re-convert it."
            )
        self.types = _number_array(metadata, "tokenizer.ggml.token_type", np.int32, n, TYPE_NORMAL, source)
        self.scores = _number_array(metadata, "tokenizer.ggml.scores", np.float32, n, 0.0, source)
        for i in np.flatnonzero(self.types == TYPE_BYTE):
            if not re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", self.tokens[i]):
                raise TokenizerError(
                    f"{source}: byte token {i} is {self.tokens[i]!r}, not <0xXX>; the file is damaged."
                )
        # llama.cpp's defaults where the file names no special token; out-of-range ids are dropped
        defaults = {
            "llama": {"bos": 1, "eos": 2, "unk": 0},
            "gpt2": {"bos": 11, "eos": 11},
            "gemma4": {},
            "bert": {"bos": 101, "eos": 102, "unk": 100},
        }[model]
        self.ids: dict[str, int | None] = {}
        for name in (
            "bos",
            "eos",
            "unk",
            "eot",
            "eom",
            "fim_pad",
            "fim_rep",
            "fim_sep",
            "fim_pre",
            "fim_suf",
            "fim_mid",
        ):
            value = _optional(metadata, f"tokenizer.ggml.{name}_token_id", int, None, source)
            if value is None or not 0 <= value < n:
                value = defaults.get(name)
            self.ids[name] = value if value is not None and 0 <= value < n else None
        self.stop_ids = self._mark_control_by_text()
        self.add_space_prefix = _optional(metadata, "tokenizer.ggml.add_space_prefix", bool, model == "llama", source)

    def _mark_control_by_text(self) -> frozenset[int]:
        """Find end-of-turn and fill-in-the-middle tokens by their text, as llama.cpp does.

        Fills the ids the file does not give, makes the tokens found control tokens, and
        returns the ids that end generation.
        """

        def found(texts):
            return [self.token_ids[t] for t in texts if t in self.token_ids]

        for name, texts in (
            ("eot", _EOT_TEXTS),
            ("eom", _EOM_TEXTS),
            ("fim_pre", _FIM_PRE_TEXTS),
            ("fim_suf", _FIM_SUF_TEXTS),
            ("fim_mid", _FIM_MID_TEXTS),
            ("fim_pad", _FIM_PAD_TEXTS),
            ("fim_rep", _FIM_REP_TEXTS),
            ("fim_sep", _FIM_SEP_TEXTS),
        ):
            if self.ids[name] is None and (hits := found(texts)):
                self.ids[name] = hits[0]
                self.types[hits[0]] = TYPE_CONTROL
        eog = found(_EOG_TEXTS)
        if all(t in self.token_ids for t in _HARMONY_TURN_ENDS):  # as llama.cpp: in harmony <|end|>
            eog.remove(self.token_ids["<|end|>"])  # ends a message, and the answer goes on
            if self.ids["eot"] == self.token_ids["<|end|>"]:
                self.ids["eot"] = None
        self.types[eog] = TYPE_CONTROL
        named = (self.ids[name] for name in ("eos", "eot", "eom", "fim_pad", "fim_rep", "fim_sep"))
        return frozenset([*eog, *(i for i in named if i is not None)])


def _byte_level_bpe(vocab: _Vocabulary, metadata: dict, source: str) -> tuple[tokenizers.Tokenizer, bool]:
    """A byte-level BPE with llama.cpp's word splitting for the file's pre-tokenizer type."""
    pre = _optional(metadata, "tokenizer.ggml.pre", str, "default", source)
    if pre not in _PRE_TYPES:
        raise TokenizerError(
            f"{source}: its pre-tokenizer type {pre!r} (tokenizer.ggml.pre) is not one Sprig knows, "
            f"so it cannot split text the way the model expects. Known types: {', '.join(sorted(_PRE_TYPES))}."
        )
    regexes, ignore_merges, add_bos_default = _PRE_TYPES[pre]
    pairs = _merge_pairs(vocab, metadata, source)
    hf = tokenizers.Tokenizer(models.BPE(vocab.token_ids, pairs, ignore_merges=ignore_merges))
    splits = [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in _SPLIT_REGEXES[regexes]]
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    hf.pre_tokenizer = pre_tokenizers.Sequence([*splits, byte_level])
    return hf, add_bos_default


def _merge_pairs(vocab: _Vocabulary, metadata: dict, source: str) -> list[tuple[str, str]]:
    """The file's BPE merges (`tokenizer.ggml.merges`, "left right" each), best first."""
    merges = _string_array(metadata, "tokenizer.ggml.merges", source)
    if merges is None:
        raise TokenizerError(
            f"{source}: its BPE vocabulary has no merge list (tokenizer.ggml.merges), "
            "so text cannot be tokenized. The file is incomplete; re-convert or re-download it."
        )
    token_ids = vocab.token_ids
    pairs = []
    for merge in merges:
        cut = merge.find(" ", 1)
        left, right = merge[:cut], merge[cut + 1 :]
        # llama.cpp ignores malformed merges; a merge into a missing token can never emit it
        if cut > 0 and left in token_ids and right in token_ids and left + right in token_ids:
            pairs.append((left, right))
    return pairs


def _gemma4_bpe(vocab: _Vocabulary, metadata: dict, source: str) -> tokenizers.Tokenizer:
    """Gemma 4's BPE: '▁' for spaces, runs of newlines cut from the rest, merges over raw
    characters, <0xXX> byte tokens for what no token covers (llama.cpp's LLAMA_VOCAB_PRE_TYPE_GEMMA4)."""
    hf = tokenizers.Tokenizer(models.BPE(vocab.token_ids, _merge_pairs(vocab, metadata, source), byte_fallback=True))
    hf.normalizer = normalizers.Replace(" ", SPM_SPACE)
    hf.pre_tokenizer = pre_tokenizers.Split(Regex(r"[^\n]+|[\n]+"), behavior="isolated")
    return hf


def _sentencepiece_bpe(vocab: _Vocabulary) -> tokenizers.Tokenizer:
    """A BPE that merges like llama.cpp's SentencePiece tokenizer.

    llama.cpp joins the adjacent pair whose joined text is the best-scoring token (leftmost
    first among equals), whatever the token's type. So every split of every token into two
    tokens is a merge, ranked by the joined token's score, best first.
    """
    token_ids = vocab.token_ids
    order = np.argsort(-vocab.scores, kind="stable")  # (n_tokens,) best score first, ties by id
    ordered = [vocab.tokens[i] for i in order.tolist()]
    pairs = [
        (left, right)
        for text in ordered
        for cut in range(1, len(text))
        if (left := text[:cut]) in token_ids and (right := text[cut:]) in token_ids
    ]
    unk = vocab.tokens[vocab.ids["unk"]] if vocab.ids["unk"] is not None else None
    hf = tokenizers.Tokenizer(models.BPE(token_ids, pairs, unk_token=unk, byte_fallback=True))
    steps = [normalizers.Prepend(SPM_SPACE)] if vocab.add_space_prefix else []
    hf.normalizer = normalizers.Sequence([*steps, normalizers.Replace(" ", SPM_SPACE)])
    return hf


def _wordpiece(vocab: _Vocabulary, metadata: dict, source: str) -> tokenizers.Tokenizer:
    """BERT's WordPiece over the file's '▁'-marked vocabulary (see the module's docstring)."""
    pieces: dict[str, int] = {}
    for i, (text, kind) in enumerate(zip(vocab.tokens, vocab.types.tolist(), strict=True)):
        if kind in (TYPE_CONTROL, TYPE_UNKNOWN, TYPE_USER_DEFINED):
            piece = text
        else:
            piece = text[1:] if text.startswith(SPM_SPACE) else "##" + text
        pieces.setdefault(piece, i)
    unk = vocab.tokens[vocab.ids["unk"]] if vocab.ids["unk"] is not None else "[UNK]"
    hf = tokenizers.Tokenizer(models.WordPiece(pieces, unk_token=unk, max_input_chars_per_word=100))
    lowercase = _optional(metadata, "tokenizer.ggml.normalizer.lowercase", bool, True, source)
    hf.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=lowercase, lowercase=lowercase
    )
    hf.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    return hf


def _add_special_tokens(hf: tokenizers.Tokenizer, vocab: _Vocabulary) -> None:
    """Register the tokens that are matched in raw text before the BPE sees it.

    Control and unknown tokens become 'special' added tokens, which `encode_special_tokens`
    turns off (llama.cpp's parse_special=false); user-defined tokens are always matched.
    """

    def added(kinds, special):
        wanted = np.flatnonzero(np.isin(vocab.types, kinds))
        return [AddedToken(vocab.tokens[i], special=special, normalized=False) for i in wanted]

    hf.add_special_tokens(added((TYPE_CONTROL, TYPE_UNKNOWN), special=True))
    hf.add_tokens(added((TYPE_USER_DEFINED,), special=False))


def _token_texts(metadata: dict, source: str) -> list[str]:
    tokens = _string_array(metadata, "tokenizer.ggml.tokens", source)
    if tokens is None:
        raise TokenizerError(
            f"{source}: the file has no vocabulary (tokenizer.ggml.tokens is missing or empty). "
            "Use a GGUF file that includes its tokenizer."
        )
    # llama.cpp gives empty tokens a placeholder text so that every text is unique
    return [t or f"[EMPTY_{i}]" for i, t in enumerate(tokens)]


def _string_array(metadata: dict, key: str, source: str) -> list[str] | None:
    """The strings under `key`; None where the key is missing or the list empty."""
    values = metadata.get(key)
    if values is None or (isinstance(values, Sequence) and not isinstance(values, str) and not values):
        return None
    if isinstance(values, str) or not isinstance(values, Sequence) or not all(isinstance(v, str) for v in values):
        raise TokenizerError(
            f"{source}: {key} should be a list of strings; the file is damaged. Re-download or re-convert it."
        )
    return list(values)


def _number_array(metadata: dict, key: str, dtype, n: int, default, source: str) -> np.ndarray:
    values = metadata.get(key)
    if values is None:
        return np.full(n, default, dtype=dtype)
    try:
        array = np.asarray(values, dtype=dtype)
    except (TypeError, ValueError):
        raise TokenizerError(f"{source}: {key} does not hold numbers; the file is damaged.") from None
    if array.ndim != 1 or len(array) < n:
        raise TokenizerError(
            f"{source}: {key} has {array.size} entries for {n} tokens; the file is damaged or truncated."
        )
    return array[:n].copy()  # (n_tokens,), writable: control tokens found by text are marked in it


def _optional(metadata: dict, key: str, kind: type[Any], default: Any, source: str) -> Any:
    value: Any = metadata.get(key, default)
    if value is not None and not (isinstance(value, kind) or (kind is int and isinstance(value, np.integer))):
        raise TokenizerError(f"{source}: {key} should be a {kind.__name__}, not {value!r}; the file is damaged.")
    return int(value) if kind is int and value is not None else value
