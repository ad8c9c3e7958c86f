"""Chat templates: real and representative templates, the built-in formats, and the sandbox.

Every expected prompt below is written out by hand from the template's documented
format, never taken from the code under test.
"""

from datetime import datetime, timedelta

import gguf
import jinja2
import pytest

from engine.bundled import bundled_model
from engine.chat_template import ChatTemplate
from engine.errors import TemplateError

CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "4."},
    {"role": "user", "content": "And 3+3?"},
]


TEMPLATE_KEYS = [
    "tokenizer.chat_template",
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id",
]


def read_metadata(path):
    """The metadata a chat template needs from a GGUF file, read with gguf-py (the reference reader)."""
    fields = gguf.GGUFReader(path).fields
    return {key: fields[key].contents() for key in TEMPLATE_KEYS if key in fields}


@pytest.fixture(scope="module")
def smollm2_metadata():
    return read_metadata(bundled_model("smollm2").path)


@pytest.fixture(scope="module")
def smollm2(smollm2_metadata):
    return ChatTemplate.from_metadata(smollm2_metadata, origin="SmolLM2-135M-Instruct.Q4_1.gguf")


# --- SmolLM2's real template (ChatML with a default system prompt) -------------------


def test_smollm2_renders_a_conversation_as_chatml(smollm2):
    assert smollm2.guessed is None
    assert smollm2.render(CONVERSATION) == (
        "<|im_start|>system\nYou are terse.<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
        "<|im_start|>assistant\n4.<|im_end|>\n"
        "<|im_start|>user\nAnd 3+3?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_smollm2_injects_its_default_system_prompt(smollm2):
    assert smollm2.render([{"role": "user", "content": "Hi"}]) == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_add_generation_prompt_off_ends_after_the_last_message(smollm2):
    assert smollm2.render(CONVERSATION[:3], add_generation_prompt=False) == (
        "<|im_start|>system\nYou are terse.<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
        "<|im_start|>assistant\n4.<|im_end|>\n"
    )


def test_special_token_texts_come_from_the_vocabulary(smollm2_metadata, smollm2):
    tokens = smollm2_metadata["tokenizer.ggml.tokens"]
    assert (smollm2.bos_token, smollm2.eos_token) == (tokens[1], tokens[2]) == ("<|im_start|>", "<|im_end|>")


def test_special_token_texts_can_come_from_a_tokenizer():
    metadata = {"tokenizer.ggml.bos_token_id": 7, "tokenizer.ggml.eos_token_id": 8}
    template = ChatTemplate.from_metadata(metadata, token_text=lambda token_id: f"<t{token_id}>")
    assert (template.bos_token, template.eos_token) == ("<t7>", "<t8>")


# --- Files without a template: the built-in format of the model's family ----------------


def test_gemma_file_without_template_gets_the_gemma_format():
    metadata = read_metadata(bundled_model("gemma3").path)  # gguf-py takes several seconds over its 262k tokens
    assert "tokenizer.chat_template" not in metadata
    template = ChatTemplate.from_metadata(metadata, origin="gemma-3-270m-q4_k_m.gguf")
    assert template.guessed and "Gemma" in template.guessed
    assert (template.bos_token, template.eos_token) == ("<bos>", "<eos>")
    # Gemma's documented turn format: the system prompt joins the first user turn.
    assert template.render(CONVERSATION) == (
        "<start_of_turn>user\nYou are terse.\n\nWhat is 2+2?<end_of_turn>\n"
        "<start_of_turn>model\n4.<end_of_turn>\n"
        "<start_of_turn>user\nAnd 3+3?<end_of_turn>\n"
        "<start_of_turn>model\n"
    )
    assert "<end_of_turn>" in template.stops and "<start_of_turn>" in template.stops
    # Its metadata names no fine-tune: a base model, told as such, that ends at its first line.
    assert template.base_model and "\n" in template.stops
    notice = template.notice("Gemma-3-270M")
    assert "no chat template" in notice and "base model" in notice


def test_a_file_with_its_own_template_is_not_a_guess(smollm2):
    assert smollm2.guessed is None and not smollm2.base_model
    assert smollm2.notice("SmolLM2") is None
    assert "<|im_end|>" in smollm2.stops


def vocabulary(*specials):
    return ["<unk>", "<s>", "</s>", *specials, "a", "b"]


@pytest.mark.parametrize("metadata, marker", [
    ({"tokenizer.ggml.tokens": vocabulary("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                                          "<|eot_id|>"), "general.architecture": "llama"}, "<|eot_id|>"),
    ({"tokenizer.ggml.tokens": vocabulary("<|im_start|>", "<|im_end|>"), "general.architecture": "llama"},
     "<|im_end|>"),
    ({"tokenizer.ggml.tokens": vocabulary(), "general.architecture": "qwen2"}, "<|im_end|>"),
    ({"tokenizer.ggml.tokens": vocabulary(), "general.architecture": "gemma2"}, "<end_of_turn>"),
    ({"tokenizer.ggml.tokens": vocabulary("[INST]", "[/INST]"), "general.architecture": "llama"}, "[INST]"),
    ({"tokenizer.ggml.tokens": vocabulary(), "general.architecture": "llama", "tokenizer.ggml.model": "llama"},
     "[INST]"),
])
def test_each_family_gets_its_own_format_and_stops(metadata, marker):
    template = ChatTemplate.from_metadata({**metadata, "general.name": "Some Model Instruct"})
    assert marker in template.stops
    assert not template.base_model and template.guessed


def test_llama3_format():
    metadata = {"tokenizer.ggml.tokens": vocabulary("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
                "general.name": "Llama 3.2 1B Instruct"}
    assert ChatTemplate.from_metadata(metadata).render(CONVERSATION[:2]) == (
        "<|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )


def test_llama2_mistral_format():
    metadata = {"tokenizer.ggml.tokens": vocabulary(), "general.architecture": "llama",
                "tokenizer.ggml.model": "llama", "tokenizer.ggml.bos_token_id": 1,
                "tokenizer.ggml.eos_token_id": 2, "general.name": "Mistral 7B Instruct v0.1"}
    assert ChatTemplate.from_metadata(metadata).render(CONVERSATION) == (
        "<s>[INST] <<SYS>>\nYou are terse.\n<</SYS>>\n\nWhat is 2+2? [/INST] 4.</s>"
        "<s>[INST] And 3+3? [/INST]"
    )


def test_chatml_is_the_last_resort():
    template = ChatTemplate.from_metadata({"general.name": "Mystery chat"})
    assert template.render(CONVERSATION[1:2]) == "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    assert "ChatML" in template.guessed


def test_only_the_default_template_is_used():
    named_only = {"tokenizer.chat_templates": ["tool_use"], "tokenizer.chat_template.tool_use": "TOOLS"}
    assert ChatTemplate.from_metadata(named_only).guessed
    with_default = {**named_only, "tokenizer.chat_template": "DEFAULT"}
    assert ChatTemplate.from_metadata(with_default).render([]) == "DEFAULT"


# --- A Gemma-3-style template: bos, folded system prompt, role renaming ---------------

GEMMA3_STYLE = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/model/user/model/...") }}
    {%- endif -%}
    {%- if message['role'] == 'assistant' -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {{- message['content'] | trim }}
    {{- '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{ '<start_of_turn>model\n' }}
{%- endif -%}
"""


def test_gemma3_style_template():
    template = ChatTemplate(GEMMA3_STYLE, bos_token="<bos>", eos_token="<eos>")
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "  Hi\n"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Bye"},
    ]
    assert template.render(messages) == (
        "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
        "<start_of_turn>model\nHello!<end_of_turn>\n"
        "<start_of_turn>user\nBye<end_of_turn>\n"
        "<start_of_turn>model\n"
    )
    assert template.render(messages[1:2], add_generation_prompt=False) == "<bos><start_of_turn>user\nHi<end_of_turn>\n"


def test_raise_exception_message_reaches_the_user():
    template = ChatTemplate(GEMMA3_STYLE, origin="gemma-chat.gguf")
    with pytest.raises(TemplateError, match="gemma-chat.gguf") as caught:
        template.render([{"role": "assistant", "content": "I speak first"}])
    assert "template says: Conversation roles must alternate user/model/user/model/..." in str(caught.value)


# --- A Qwen3-style template: tools, namespace, break, loop.last, thinking --------------

QWEN3_STYLE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\\n\\n' }}
    {%- endif %}
    {{- "# Tools\\n\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools><|im_end|>\\n" }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- set ns = namespace(last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- if message.role == 'user' %}
        {%- set ns.last_query_index = messages|length - 1 - loop.index0 %}
        {%- break %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.role == 'system' %}
        {%- continue %}
    {%- elif message.role == 'user' %}
        {{- '<|im_start|>user\\n' + message.content + '<|im_end|>\\n' }}
    {%- elif message.role == 'assistant' %}
        {%- set content = message.content %}
        {%- set reasoning = '' %}
        {%- if '</think>' in content %}
            {%- set reasoning = content.split('</think>')[0].split('<think>')[-1].strip('\\n') %}
            {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index and reasoning %}
            {{- '<|im_start|>assistant\\n<think>\\n' + reasoning + '\\n</think>\\n\\n' + content }}
        {%- else %}
            {{- '<|im_start|>assistant\\n' + content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls or [] %}
            {{- '\\n<tool_call>\\n{"name": "' + tool_call.name + '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == 'tool' %}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}
"""

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather (météo) in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
WEATHER_TOOL_JSON = (
    '{"type": "function", "function": {"name": "get_weather", "description": "Current weather (météo) in a city", '
    '"parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}'
)


def test_qwen3_style_template_with_tools_and_kept_reasoning():
    messages = [
        {"role": "system", "content": "You are Bonsai."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "<think>\nNeed the tool.\n</think>\n\n",
            "tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}],
        },
        {"role": "tool", "content": '{"temp_c": 21}'},
        {"role": "tool", "content": '{"wind_kmh": 5}'},
    ]
    assert ChatTemplate(QWEN3_STYLE).render(messages, tools=[WEATHER_TOOL]) == (
        "<|im_start|>system\nYou are Bonsai.\n\n# Tools\n\n<tools>\n" + WEATHER_TOOL_JSON + "\n</tools><|im_end|>\n"
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nNeed the tool.\n</think>\n\n"
        '\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>\n'
        '<|im_start|>user\n<tool_response>\n{"temp_c": 21}\n</tool_response>'
        '\n<tool_response>\n{"wind_kmh": 5}\n</tool_response><|im_end|>\n'
        "<|im_start|>assistant\n"
    )


def test_qwen3_style_template_drops_old_reasoning_and_passes_extra_variables():
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "<think>\nGreet back.\n</think>\n\nHello!"},
        {"role": "user", "content": "Bye"},
    ]
    assert ChatTemplate(QWEN3_STYLE).render(messages, enable_thinking=False) == (
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n"
        "<|im_start|>user\nBye<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )


# --- Hugging Face helpers --------------------------------------------------------------


def test_tojson_neither_escapes_html_nor_ascii_encodes():
    value = {"b": 1, "a": "<tag> & 'quote' — café"}
    rendered = ChatTemplate("{{ value | tojson }}").render([], value=value)
    assert rendered == '{"b": 1, "a": "<tag> & \'quote\' — café"}'


def test_tojson_takes_the_json_dumps_options():
    template = ChatTemplate("{{ value | tojson(sort_keys=true, separators=(',', ':')) }}|{{ [1] | tojson(indent=2) }}")
    assert template.render([], value={"b": 1, "a": "é"}) == '{"a":"é","b":1}|[\n  1\n]'


def test_strftime_now_formats_the_current_date():
    before = datetime.now()
    rendered = ChatTemplate("{{ strftime_now('%d %b %Y') }}").render([])
    after = datetime.now() + timedelta(seconds=1)
    assert rendered in {before.strftime("%d %b %Y"), after.strftime("%d %b %Y")}


def test_extra_variables_may_override_special_tokens():
    template = ChatTemplate("{{ bos_token }}|{{ eos_token }}", bos_token="<s>", eos_token="</s>")
    assert template.render([]) == "<s>|</s>"
    assert template.render([], bos_token="") == "|</s>"


# --- Broken templates --------------------------------------------------------------------


def test_syntax_error_names_the_file_and_line():
    source = "{% for message in messages %}\n{{ message['content'] }}\n{% if %}\n{% endfor %}"
    with pytest.raises(TemplateError, match=r"broken\.gguf is not valid Jinja \(line 3"):
        ChatTemplate(source, origin="broken.gguf")


def test_render_failure_names_the_file_and_line():
    template = ChatTemplate("{{ messages[0]['content'] }}\n{{ messages[0]['content'] / 2 }}", origin="odd.gguf")
    with pytest.raises(TemplateError, match=r"odd\.gguf failed on line 2"):
        template.render([{"role": "user", "content": "text"}])


# --- Runaway templates ---------------------------------------------------------------------


@pytest.mark.timeout(20)
@pytest.mark.parametrize(
    ("source", "reason"),
    [
        pytest.param("{% for i in range(10**9) %}x{% endfor %}", "its ranges ask for more", id="huge-range"),
        pytest.param(
            "{% for i in range(10**5) %}{% for j in range(10**5) %}{% endfor %}{% endfor %}",
            "its ranges ask for more",
            id="nested-ranges",
        ),
        pytest.param("{{ 'a' * 10**10 }}", "it repeats a str", id="huge-repeat"),
        pytest.param("{{ [0] * 10**10 }}", "it repeats a list", id="huge-list"),
        pytest.param("{{ 7 ** (10**9) }}", "it computes 7 \\*\\*", id="huge-power"),
        pytest.param("{% for i in range(10**5) %}{{ 'x' * 10**4 }}{% endfor %}", "its output grows", id="huge-output"),
    ],
)
def test_runaway_template_is_stopped(source, reason):
    template = ChatTemplate(source, origin="loop.gguf")
    with pytest.raises(TemplateError, match=rf"loop\.gguf was stopped because {reason}"):
        template.render([])


def test_ranges_of_ordinary_size_still_work():
    template = ChatTemplate("{% for i in range(messages|length - 1, -1, -1) %}{{ messages[i]['content'] }}{% endfor %}")
    assert template.render([{"content": "a"}, {"content": "b"}, {"content": "c"}]) == "cba"


# --- Hostile templates (CVE-2024-34359 and variants) --------------------------------------

PAYLOADS = {
    "self": "{{ self.__init__.__globals__.__builtins__.__import__('os').system('touch MARKER') }}",
    "cycler": "{{ cycler.__init__.__globals__.os.popen('touch MARKER').read() }}",
    "joiner": "{{ joiner.__init__.__globals__.os.system('touch MARKER') }}",
    "namespace": "{{ namespace.__init__.__globals__.os.system('touch MARKER') }}",
    "lipsum": "{{ lipsum.__globals__['os'].system('touch MARKER') }}",
    "attr-filter": "{{ (lipsum | attr('__globals__'))['os'].system('touch MARKER') }}",
    "subclasses": (
        "{% for c in ''.__class__.__mro__[1].__subclasses__() %}{% if c.__name__ == 'catch_warnings' %}"
        "{{ c()._module.__builtins__['__import__']('os').system('touch MARKER') }}{% endif %}{% endfor %}"
    ),
    "CVE-2024-34359": (
        "{% for x in ().__class__.__base__.__subclasses__() %}{% if x.__name__ == \"catch_warnings\" %}"
        "{{ x()._module.__builtins__['__import__']('os').popen(\"touch MARKER\").read() }}{%endif%}{% endfor %}"
    ),
}


@pytest.mark.parametrize("name", PAYLOADS)
def test_payload_is_live_outside_the_sandbox(name, tmp_path):
    """Control: each payload really runs a command in plain Jinja, so the sandbox test means something."""
    marker = tmp_path / "pwned"
    jinja2.Environment().from_string(PAYLOADS[name].replace("MARKER", str(marker))).render()
    assert marker.exists()


@pytest.mark.parametrize("name", PAYLOADS)
def test_payload_is_refused_and_runs_nothing(name, tmp_path):
    marker = tmp_path / "pwned"
    template = ChatTemplate(PAYLOADS[name].replace("MARKER", str(marker)), origin="evil.gguf")
    refused = r"evil\.gguf tried something the sandbox forbids .* nothing it asked for was run"
    with pytest.raises(TemplateError, match=refused):
        template.render([{"role": "user", "content": "hi"}])
    assert not marker.exists()


def test_reading_an_unsafe_attribute_alone_fails_loudly():
    """Plain Jinja sandboxes render `{{ x.__class__ }}` as empty text; Sprig stops instead."""
    with pytest.raises(TemplateError, match="'__class__'"):
        ChatTemplate("{{ messages.__class__ }}").render([])


def test_template_cannot_modify_the_callers_messages():
    messages = [{"role": "user", "content": "hi"}]
    with pytest.raises(TemplateError, match="forbids"):
        ChatTemplate("{{ messages.append({'role': 'system', 'content': 'obey'}) }}").render(messages)
    assert messages == [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(("key", "expected"), [
    # written out from llama.cpp's llm_chat_apply_template (src/llama-chat.cpp) for the same chat
    ("phi3", "<|system|>\nBe brief.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\nHello.<|end|>\n"
             "<|user|>\nWhy?<|end|>\n<|assistant|>\n"),
    ("command-r", "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>Be brief.<|END_OF_TURN_TOKEN|>"
                  "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>Hi<|END_OF_TURN_TOKEN|>"
                  "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>Hello.<|END_OF_TURN_TOKEN|>"
                  "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>Why?<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"),
    ("granite", "<|start_of_role|>system<|end_of_role|>Be brief.<|end_of_text|>\n"
                "<|start_of_role|>user<|end_of_role|>Hi<|end_of_text|>\n"
                "<|start_of_role|>assistant<|end_of_role|>Hello.<|end_of_text|>\n"
                "<|start_of_role|>user<|end_of_role|>Why?<|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|>"),
])
def test_the_new_families_built_in_formats_write_llama_cpps_turns(key, expected):
    from engine.builtin_templates import FORMATS

    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Why?"}]
    assert ChatTemplate(FORMATS[key].source).render(chat) == expected


@pytest.mark.parametrize(("architecture", "key"), [("phi3", "phi3"), ("granite", "granite"), ("command-r", "command-r"),
                                                   ("cohere2", "command-r"), ("gemma", "gemma")])
def test_a_file_without_a_template_gets_its_familys_format(architecture, key):
    from engine.builtin_templates import guess_format

    chosen, why = guess_format({"general.architecture": architecture, "tokenizer.ggml.tokens": ["a", "b"]})
    assert chosen.key == key and architecture in why
