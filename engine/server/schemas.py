"""The request bodies the server accepts, as pydantic models with every number bounded.

Fields that OpenAI defines but Sprig does not use (`user`, `store`, `metadata`...) are
accepted and ignored; anything else is refused with a 400 naming the field, so that a
typo (`max_token`) is not silently dropped.
"""

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

MAX_STOP_STRINGS = 16
MAX_TOKENS_LIMIT = 1_000_000
SEED_LIMIT = 2**63 - 1
MAX_CHOICES = 8  # n: choices of one request (each runs as a request of its own, batched)
MAX_TOP_LOGPROBS = 20  # chat's top_logprobs (OpenAI's bound); completions' logprobs: 5
MAX_LOGIT_BIAS = 1024  # entries of logit_bias
Text = Annotated[str, Field(max_length=1_000_000)]
Name = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")]


class Strict(BaseModel):
    """A request object that refuses unknown fields."""

    model_config = ConfigDict(extra="forbid", strict=True)  # "12" is not a number, nor 1 a boolean


class FunctionDefinition(Strict):
    name: Name
    description: Annotated[str, Field(max_length=10_000)] | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(Strict):
    type: Literal["function"]
    function: FunctionDefinition


class CalledFunction(Strict):
    name: Name
    arguments: Text


class AssistantToolCall(Strict):
    id: Annotated[str, Field(max_length=256)]
    type: Literal["function"] = "function"
    function: CalledFunction


class TextPart(Strict):
    type: Literal["text"]
    text: Text


class Message(Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Text | Annotated[list[TextPart], Field(max_length=256)] | None = None
    name: Annotated[str, Field(max_length=256)] | None = None
    tool_calls: Annotated[list[AssistantToolCall], Field(max_length=64)] | None = None
    tool_call_id: Annotated[str, Field(max_length=256)] | None = None

    def text(self) -> str:
        """The content as one string (text parts joined)."""
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class JsonSchemaFormat(Strict):
    name: Annotated[str, Field(max_length=256)] = "response"
    description: Annotated[str, Field(max_length=10_000)] | None = None
    schema_: dict[str, Any] = Field(default_factory=lambda: {"type": "object"}, alias="schema")
    strict: bool | None = None


class ResponseFormat(Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StreamOptions(Strict):
    include_usage: bool = False


class NamedFunction(Strict):
    name: Name


class NamedToolChoice(Strict):
    type: Literal["function"]
    function: NamedFunction


class GenerationRequest(Strict):
    """Fields shared by chat and text completions."""

    model: Annotated[str, Field(max_length=256)] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: Annotated[int, Field(ge=1, le=MAX_TOKENS_LIMIT)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Field(ge=0, le=100_000)] | None = None
    min_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    presence_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    frequency_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    repetition_penalty: Annotated[float, Field(gt=0.0, le=10.0)] | None = None
    repeat_penalty: Annotated[float, Field(gt=0.0, le=10.0)] | None = None  # llama.cpp's name
    seed: Annotated[int, Field(ge=0, le=SEED_LIMIT)] | None = None
    stop: (
        Annotated[str, Field(max_length=256)]
        | Annotated[list[Annotated[str, Field(max_length=256)]], Field(max_length=MAX_STOP_STRINGS)]
        | None
    ) = None
    n: Annotated[int, Field(ge=1, le=MAX_CHOICES)] = 1
    # token id (a decimal string, as JSON keys are) -> bias in [-100, 100]; -100 bans the token
    logit_bias: (
        Annotated[
            dict[Annotated[str, Field(max_length=12)], Annotated[float, Field(ge=-100.0, le=100.0)]],
            Field(max_length=MAX_LOGIT_BIAS),
        ]
        | None
    ) = None
    # Defined by OpenAI, accepted and ignored:
    user: Annotated[str, Field(max_length=256)] | None = None
    store: bool | None = None
    metadata: dict[str, Any] | None = None

    def stop_strings(self) -> list[str]:
        """The stop strings as a list (empty strings dropped)."""
        stops = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        return [s for s in stops if s]


class ChatCompletionRequest(GenerationRequest):
    messages: Annotated[list[Message], Field(min_length=1, max_length=4096)]
    # vLLM's names: go on with the last message, an assistant's answer, instead of starting a new one
    continue_final_message: bool = False
    add_generation_prompt: bool = True
    max_completion_tokens: Annotated[int, Field(ge=1, le=MAX_TOKENS_LIMIT)] | None = None
    response_format: ResponseFormat | None = None
    tools: Annotated[list[Tool], Field(max_length=128)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None


class CompletionRequest(GenerationRequest):
    prompt: Text | Annotated[list[Text], Field(min_length=1, max_length=1)]
    echo: Literal[False] | None = None
    logprobs: Annotated[int, Field(ge=0, le=5)] | None = None  # how many top tokens per step


MAX_EMBEDDING_INPUTS = 256


class EmbeddingRequest(Strict):
    """POST /v1/embeddings: a string or a list of strings (token arrays are refused: their
    ids would be another tokenizer's)."""

    input: Text | Annotated[list[Text], Field(min_length=1, max_length=MAX_EMBEDDING_INPUTS)]
    model: Annotated[str, Field(max_length=256)] | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, Field(ge=1, le=1_000_000)] | None = None
    user: Annotated[str, Field(max_length=256)] | None = None


class TokenizeRequest(Strict):
    content: Text
    add_special: bool = False
    parse_special: bool = False
