"""Built-in chat formats for model files that carry no chat template.

Each format follows llama.cpp's built-in template of the same name (`llama-chat.cpp`):
the same turn markers, the system prompt handled the same way, and generation stopping
on the same end-of-turn tokens. Sprig picks the format that belongs to the model's
family, as llama.cpp's template detection would for a file that names its format:

- the vocabulary's turn tokens are the strongest evidence (Gemma's `<start_of_turn>`,
  Command-R's `<|START_OF_TURN_TOKEN|>`, Granite's `<|start_of_role|>`, Llama 3's
  `<|start_header_id|>`, ChatML's `<|im_start|>`, Mistral's `[INST]`);
- failing those, the architecture (gemma*, qwen*, phi3, granite, command-r and cohere2, a
  SentencePiece llama);
- failing everything, ChatML.

The sources are Jinja and render in the same sandbox as a file's own template.
"""

import re
from dataclasses import dataclass

# Turn text is written by expressions only: the `-` markers of the tags strip the
# whitespace around them, which would eat newlines written as plain template text.

# The system prompt joins the first user turn; the assistant's role is called "model".
GEMMA = (
    "{%- set ns = namespace(prefix='') -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' -%}"
    "{%- set ns.prefix = ns.prefix + (message['content'] | trim) + '\\n\\n' -%}"
    "{%- else -%}"
    "{{ '<start_of_turn>' + ('model' if message['role'] == 'assistant' else message['role']) + '\\n' }}"
    "{{ ns.prefix if message['role'] == 'user' else '' }}"
    "{{ (message['content'] | trim) + '<end_of_turn>\\n' }}"
    "{%- if message['role'] == 'user' -%}{%- set ns.prefix = '' -%}{%- endif -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}"
)

LLAMA3 = (
    "{%- for message in messages -%}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}"
    "{{ (message['content'] | trim) + '<|eot_id|>' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif -%}"
)

# Llama 2 and Mistral v1: every user turn opens with BOS and [INST]; the system prompt
# sits in <<SYS>> inside the first user turn; every answer ends with EOS.
LLAMA2 = (
    "{%- set ns = namespace(system='') -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' -%}"
    "{%- set ns.system = '<<SYS>>\\n' + (message['content'] | trim) + '\\n<</SYS>>\\n\\n' -%}"
    "{%- elif message['role'] == 'user' -%}"
    "{{ bos_token + '[INST] ' + ns.system + (message['content'] | trim) + ' [/INST]' }}"
    "{%- set ns.system = '' -%}"
    "{%- else -%}"
    "{{ ' ' + (message['content'] | trim) + eos_token }}"
    "{%- endif -%}"
    "{%- endfor -%}"
)

CHATML = (
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)


# Phi-3: each turn `<|role|>` on its own line, ended by <|end|>.
PHI3 = (
    "{%- for message in messages -%}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + '<|end|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|assistant|>\\n' }}{%- endif -%}"
)
# Command-R (and Command R7B): role tokens inside turn tokens, the contents trimmed.
COMMAND_R = (
    "{%- set roles = {'system': '<|SYSTEM_TOKEN|>', 'user': '<|USER_TOKEN|>', 'assistant': '<|CHATBOT_TOKEN|>'} -%}"
    "{%- for message in messages if message['role'] in roles -%}"
    "{{ '<|START_OF_TURN_TOKEN|>' + roles[message['role']] + (message['content'] | trim) + '<|END_OF_TURN_TOKEN|>' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>' }}{%- endif -%}"
)
# Granite 3.x: each turn's role between <|start_of_role|> and <|end_of_role|>, ended by <|end_of_text|>.
GRANITE = (
    "{%- for message in messages -%}"
    "{{ '<|start_of_role|>' + message['role'] + '<|end_of_role|>' + message['content'] + '<|end_of_text|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|start_of_role|>assistant<|end_of_role|>' }}{%- endif -%}"
)


@dataclass(frozen=True)
class ChatFormat:
    """A built-in chat format: its name for people, Jinja source, and what ends a turn.

    `stops` are texts that end an answer: the end-of-turn markers and the opening of
    the next turn. Where the vocabulary has a token of that text, the token stops too.
    """

    key: str
    name: str
    source: str
    stops: tuple[str, ...]


FORMATS = {
    "gemma": ChatFormat("gemma", "Gemma", GEMMA, ("<end_of_turn>", "<start_of_turn>")),
    "llama3": ChatFormat("llama3", "Llama 3", LLAMA3, ("<|eot_id|>", "<|start_header_id|>")),
    "llama2": ChatFormat("llama2", "Llama 2 / Mistral", LLAMA2, ("</s>", "[INST]")),
    "chatml": ChatFormat("chatml", "ChatML", CHATML, ("<|im_end|>", "<|im_start|>")),
    "phi3": ChatFormat("phi3", "Phi-3", PHI3, ("<|end|>", "<|user|>")),
    "command-r": ChatFormat("command-r", "Command-R", COMMAND_R, ("<|END_OF_TURN_TOKEN|>", "<|START_OF_TURN_TOKEN|>")),
    "granite": ChatFormat("granite", "Granite", GRANITE, ("<|end_of_text|>", "<|start_of_role|>")),
}

# Vocabulary tokens that only one format uses, strongest evidence first.
_MARKER_TOKENS = (
    ("<start_of_turn>", "gemma"),
    ("<|START_OF_TURN_TOKEN|>", "command-r"),
    ("<|start_of_role|>", "granite"),
    ("<|start_header_id|>", "llama3"),
    ("<|im_start|>", "chatml"),
    ("[INST]", "llama2"),
)

# Words in a model's name that mark it as tuned to follow instructions.
_INSTRUCT_WORDS = ("instruct", "chat", "-it", "_it", ".it", " it", "sft", "dpo", "rlhf", "assistant")


def guess_format(metadata: dict) -> tuple[ChatFormat, str]:
    """The chat format of a model file without a template, and why (for the user).

    `metadata` is the file's key → value mapping.
    """
    tokens = set(metadata.get("tokenizer.ggml.tokens", []))
    for marker, key in _MARKER_TOKENS:
        if marker in tokens:
            return FORMATS[key], f"its vocabulary has the {marker} token"
    architecture = str(metadata.get("general.architecture", ""))
    if architecture.startswith("gemma"):
        return FORMATS["gemma"], f"its architecture is {architecture}"
    if architecture.startswith("qwen"):
        return FORMATS["chatml"], f"its architecture is {architecture}"
    if architecture in ("phi3", "granite"):
        return FORMATS[architecture], f"its architecture is {architecture}"
    if architecture in ("command-r", "cohere2"):
        return FORMATS["command-r"], f"its architecture is {architecture}"
    if architecture == "llama" and metadata.get("tokenizer.ggml.model") == "llama":
        return FORMATS["llama2"], "it is a Llama model with a SentencePiece vocabulary"
    return FORMATS["chatml"], "nothing in the file names a format, and ChatML is the most common one"


def stops_in_source(source: str) -> tuple[str, ...]:
    """The end-of-turn texts of every built-in format whose markers a template source writes."""
    return tuple(
        stop for chat_format in FORMATS.values() if chat_format.stops[0] in source for stop in chat_format.stops
    )


def looks_like_base_model(metadata: dict, file_name: str) -> bool:
    """Whether a file without a chat template seems to hold a base (not instruction-tuned) model.

    Judged from the words in its name, fine-tune label and file name: instruction-tuned
    models are almost always called "-Instruct", "-it", "-chat" and the like.
    """
    words = " ".join(str(metadata.get(key, "")) for key in ("general.name", "general.finetune"))
    text = f" {words} {file_name} ".lower()
    return not any(word in text for word in _INSTRUCT_WORDS)


def is_base_model(metadata: dict, file_name: str) -> bool:
    """Whether a file holds a base model (pre-trained, not tuned to chat), which the app opens for completion.

    The rule: its name, fine-tune label, tags or file name say "base" (Qwen3-0.6B-Base, whose
    file carries a chat template all the same); or it has no chat template and nothing in its
    names says it was instruction-tuned (`looks_like_base_model`), as the Gemma-3-270M file.
    """
    tags = " ".join(str(tag) for tag in metadata.get("general.tags") or [])
    words = " ".join(str(metadata.get(key, "")) for key in ("general.name", "general.finetune"))
    if re.search(r"(?<![a-z])base(?![a-z])", f"{words} {tags} {file_name}".lower()):
        return True
    return not metadata.get("tokenizer.chat_template") and looks_like_base_model(metadata, file_name)
