"""Chat templates: turn a conversation into the prompt text a model was trained on.

A GGUF file carries its chat template as Jinja source (`tokenizer.chat_template`), written
for Hugging Face transformers. Such a template is code from whoever made the file, so it
runs in Jinja's `ImmutableSandboxedEnvironment`, set up the way transformers sets it up
(`trim_blocks`, `lstrip_blocks`, loop controls, and the helpers `raise_exception`,
`strftime_now` and a `tojson` that does not escape HTML).

On top of the sandbox, Sprig is stricter than transformers in two ways:

- Any access to an attribute the sandbox calls unsafe (`__class__`, `__globals__`, ...)
  stops the render at once with a `TemplateError`, instead of quietly yielding an
  undefined value. A template that reaches for Python internals is hostile, as in
  CVE-2024-34359 against llama-cpp-python, and the user should hear about it.
- The usual ways to make a render run away are bounded: the items of all `range()` calls
  in one render, the size of `*` repetitions and `**` powers, and the length of the
  rendered text. These guards stop runaway templates; they are not a CPU quota.

A file without a template gets the built-in format of its model family
(`engine.builtin_templates`), and says so: `guessed` is then the format's name and why.
"""

import json
import traceback
from collections.abc import Callable
from datetime import datetime

from jinja2 import TemplateSyntaxError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

from engine.builtin_templates import guess_format, looks_like_base_model, stops_in_source
from engine.errors import TemplateError

MAX_RANGE_ITEMS = 1_000_000  # all range() calls of one render together
MAX_RENDERED_CHARS = 4_000_000  # about a million tokens, more than any context window
MAX_POWER_BITS = 10_000  # size of an integer `**` result

_TEMPLATE_FILENAME = "<template>"  # what Jinja calls a template compiled from a string


class _TemplateRaised(Exception):
    """The template called `raise_exception(message)`."""


class _LimitExceeded(Exception):
    """The template asked for more work or output than a render may take."""


def _raise_exception(message: str) -> None:
    raise _TemplateRaised(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    """JSON as transformers' templates expect it: no HTML escaping, non-ASCII kept."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _bounded_repeat(left, right):
    """`left * right`, refusing sequence repetitions longer than a render may be."""
    for seq, times in ((left, right), (right, left)):
        if isinstance(seq, (str, list, tuple)) and isinstance(times, int) and len(seq) * times > MAX_RENDERED_CHARS:
            raise _LimitExceeded(f"it repeats a {type(seq).__name__} of length {len(seq)} {times} times")
    return left * right


def _bounded_power(base, exponent):
    """`base ** exponent`, refusing integers too big to compute quickly."""
    if isinstance(base, int) and isinstance(exponent, int) and exponent * abs(base).bit_length() > MAX_POWER_BITS:
        raise _LimitExceeded(f"it computes {base} ** {exponent}")
    return base**exponent


def _budgeted_range(budget: int) -> Callable[..., range]:
    """A `range` for one render that refuses to hand out more than `budget` items in all."""
    remaining = budget

    def bounded_range(*args: int) -> range:
        nonlocal remaining
        items = range(*args)
        remaining -= len(items)
        if remaining < 0:
            raise _LimitExceeded(f"its ranges ask for more than {budget} items in one render")
        return items

    return bounded_range


class _ChatSandbox(ImmutableSandboxedEnvironment):
    """Jinja's immutable sandbox, as transformers configures it, with Sprig's extra guards."""

    intercepted_binops = frozenset({"*", "**"})

    def __init__(self) -> None:
        super().__init__(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        self.filters["tojson"] = _tojson
        self.globals["raise_exception"] = _raise_exception
        self.globals["strftime_now"] = _strftime_now
        self.binop_table["*"] = _bounded_repeat
        self.binop_table["**"] = _bounded_power

    def unsafe_undefined(self, obj, attribute):
        """Stop the render at the first unsafe attribute, rather than render it as empty."""
        raise SecurityError(f"access to the attribute {attribute!r} of an object of type {type(obj).__name__!r}")


_SANDBOX = _ChatSandbox()


def _template_line(exc: BaseException) -> int | None:
    """The template line where `exc` was raised, from the frames Jinja maps back to it."""
    lines = [frame.lineno for frame in traceback.extract_tb(exc.__traceback__) if frame.filename == _TEMPLATE_FILENAME]
    return lines[-1] if lines else None


class ChatTemplate:
    """A model's chat template, compiled once in the sandbox and rendered per chat turn.

    `bos_token` and `eos_token` are the texts the template sees under those names;
    `stops` are the texts that end an answer in this format (its end-of-turn markers).
    `guessed` is None when the template came from the model file; otherwise it says which
    built-in format stands in and why. `base_model` is True when the model looks like a
    base model rather than an instruction-tuned one.
    """

    def __init__(
        self,
        source: str,
        *,
        bos_token: str = "",
        eos_token: str = "",
        origin: str = "",
        stops: tuple[str, ...] | None = None,
        guessed: str | None = None,
        base_model: bool = False,
    ):
        """Compile `source` (Jinja text).

        `origin` names the model file in error messages; `stops` default to the end-of-turn
        markers of the built-in formats that `source` writes. Raises TemplateError when the
        source is not valid Jinja.
        """
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.stops = stops_in_source(source) if stops is None else stops
        self.guessed = guessed
        self.base_model = base_model
        self._where = f"The chat template in {origin}" if origin else "The model's chat template"
        try:
            self._template = _SANDBOX.from_string(source)
        except TemplateSyntaxError as exc:
            raise TemplateError(
                f"{self._where} is not valid Jinja (line {exc.lineno}: {exc.message}). "
                "The file is damaged or was made by a broken converter; try another copy of this model."
            ) from exc

    @classmethod
    def from_metadata(
        cls, metadata: dict, token_text: Callable[[int], str] | None = None, origin: str = ""
    ) -> "ChatTemplate":
        """Build the template of a GGUF file from its metadata (key → value).

        Uses the default template, `tokenizer.chat_template`; named templates that a file
        may list under `tokenizer.chat_templates` are not used. A file without a default
        template gets the built-in format of its family (`guess_format`). The BOS/EOS texts
        come from `token_text(id)` when given, else from the vocabulary in
        `tokenizer.ggml.tokens`.
        """
        tokens = metadata.get("tokenizer.ggml.tokens", [])
        text_of = token_text or (lambda token_id: tokens[token_id] if 0 <= token_id < len(tokens) else "")

        def special(key: str) -> str:
            token_id = metadata.get(key)
            return "" if token_id is None else text_of(int(token_id))

        bos_token = special("tokenizer.ggml.bos_token_id")
        eos_token = special("tokenizer.ggml.eos_token_id")
        source = metadata.get("tokenizer.chat_template")
        if source:
            return cls(source, origin=origin, bos_token=bos_token, eos_token=eos_token)
        chat_format, reason = guess_format(metadata)
        base_model = looks_like_base_model(metadata, origin)
        # A base model never learnt where its turn ends: its answer ends with its first line.
        stops = chat_format.stops + (("\n",) if base_model else ())
        return cls(
            chat_format.source,
            origin=origin,
            stops=stops,
            bos_token=bos_token,
            eos_token=eos_token,
            guessed=f"the {chat_format.name} format, because {reason}",
            base_model=base_model,
        )

    def notice(self, model_name: str) -> str | None:
        """What the user should hear once about this template, or None when all is normal."""
        parts = []
        if self.guessed:
            parts.append(f"{model_name} has no chat template of its own, so Sprig uses {self.guessed}.")
        if self.base_model:
            parts.append(
                f"{model_name} looks like a base model, not one tuned to chat: expect answers "
                "that wander. Sprig ends each answer at the first line break."
            )
        return " ".join(parts) or None

    def render(self, messages: list[dict], *, add_generation_prompt: bool = True, tools=None, **extra) -> str:
        """Render `messages` (dicts with "role" and "content") into prompt text.

        `add_generation_prompt` appends the opening of the assistant's turn; `tools` and any
        `extra` variables (e.g. `enable_thinking`) are passed to the template as they are.
        Raises TemplateError when the template fails, refuses the conversation, reaches
        for something the sandbox forbids, or runs away.
        """
        variables = {
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            **extra,
            "messages": messages,
            "tools": tools,
            "add_generation_prompt": add_generation_prompt,
            "range": _budgeted_range(MAX_RANGE_ITEMS),
        }
        chunks, length = [], 0
        try:
            for chunk in self._template.generate(variables):
                length += len(chunk)
                if length > MAX_RENDERED_CHARS:
                    raise _LimitExceeded(f"its output grows past {MAX_RENDERED_CHARS} characters")
                chunks.append(chunk)
        except _TemplateRaised as exc:
            raise TemplateError(f"{self._where} refused this conversation; the template says: {exc}") from exc
        except _LimitExceeded as exc:
            raise TemplateError(
                f"{self._where} was stopped because {exc}. "
                "The template is broken or hostile; use another copy of this model."
            ) from exc
        except SecurityError as exc:
            raise TemplateError(
                f"{self._where} tried something the sandbox forbids ({exc}) and was stopped; "
                "nothing it asked for was run. "
                "The file may be malicious: delete it and get the model from a source you trust."
            ) from exc
        except Exception as exc:  # any other failure of the file's template code
            line = _template_line(exc)
            at = f" on line {line}" if line else ""
            raise TemplateError(
                f"{self._where} failed{at}: {exc}. "
                "The template may not support this conversation; try another copy of this model."
            ) from exc
        return "".join(chunks)
