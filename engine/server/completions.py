"""From an OpenAI request to a generation on the scheduler, and from its events to answers.

`plan_chat` and `plan_completion` check a request against the model (template, context,
schemas) and return a `Plan`; nothing runs on the model before the request is known to
be good. A `Generation` queues the plan on the scheduler and yields its events on the
event loop; leaving early (the client went away) cancels it.
"""

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from engine.chat_session import answer_stops, chat_prompt_tokens
from engine.errors import SprigError
from engine.generation import (
    FINISH_CANCELLED,
    FINISH_CONTEXT_FULL,
    FINISH_LENGTH,
    GenerationEvent,
    generate,
)
from engine.kv_cache import KVCache
from engine.loader import LoadedModel
from engine.sampling import Sampler, SamplingParams
from engine.server.constrained import (
    GrammarError,
    GuidedSampler,
    check_grammar,
    json_schema_grammar,
    tool_call_grammar,
)
from engine.server.errors import APIError
from engine.server.options import OptionSampler
from engine.server.scheduler import (
    END,
    SERVER,
    QueueFull,
    Scheduler,
    SchedulerClosed,
    Ticket,
)
from engine.server.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    GenerationRequest,
    NamedToolChoice,
)
from engine.server.tool_calls import call_schema, call_style

RETRY_AFTER_SECONDS = "2"


class CachePool:
    """The KV caches of server requests: one per request that runs, made as concurrency needs them.

    A request takes the free cache that already holds the longest prefix of its prompt
    (the least recently used among equals), so a request that continues the previous one
    (a chat client resending the history) prefills only its new tokens. At most `size`
    caches are made: the scheduler runs at most that many server requests at once.
    """

    def __init__(self, loaded: LoadedModel, n_ctx: int | None, size: int):
        self._loaded, self.size = loaded, size
        first = loaded.new_cache(n_ctx)
        self.n_ctx = first.n_ctx
        self.caches: list[KVCache] = [first]  # every cache made
        self._free: list[KVCache] = [first]  # least recently used first
        self._lock = threading.Lock()

    def acquire(self, prompt: list[int]) -> KVCache:
        """The cache a request with `prompt` should run on; it is the request's until `release`."""
        with self._lock:
            if self._free:
                cache = max(self._free, key=lambda c: c.common_prefix(prompt))  # the first of equals: LRU
                self._free.remove(cache)
                return cache
            if len(self.caches) >= self.size:
                raise RuntimeError(f"all {self.size} KV caches of the server are in use")
            cache = self._loaded.new_cache(self.n_ctx)
            self.caches.append(cache)
            return cache

    def release(self, cache: KVCache) -> None:
        """Give `cache` back, keeping what it holds for a request that continues it."""
        with self._lock:
            self._free.append(cache)


class ServedModel:
    """The model the server serves: the scheduler that owns it and the KV caches of server requests."""

    def __init__(self, loaded: LoadedModel, scheduler: Scheduler, name: str, n_ctx: int | None = None):
        self.loaded = loaded
        self.scheduler = scheduler
        self.name = name
        self.caches = CachePool(loaded, n_ctx, scheduler.max_batch)
        self.chat_stops = answer_stops(loaded)
        self.stop_ids = tuple(sorted(set(loaded.tokenizer.stop_ids) | set(self.chat_stops["stop_ids"])))
        self.call_style = call_style(loaded.tokenizer)
        self.created = int(time.time())

    @property
    def n_ctx(self) -> int:
        """Context length of server requests."""
        return self.caches.n_ctx


@dataclass
class Plan:
    """A checked request, ready to run."""

    prompt: list[int]
    params: SamplingParams
    max_tokens: int
    stop_strings: list[str]
    stop_ids: set[int] = field(default_factory=set)
    grammar: str | None = None
    parse_tools: bool = False
    logit_bias: dict[int, float] = field(default_factory=dict)
    top_logprobs: int | None = None  # None: no log-probabilities; k: the k most likely tokens too
    n: int = 1  # choices; choice i runs `choice(i)`

    def choice(self, i: int) -> "Plan":
        """The plan of choice i: the same request, its seed `seed + i` where a seed is given."""
        seed = self.params.seed
        return replace(self, params=replace(self.params, seed=None if seed is None else seed + i), n=1)


def sampling_params(request: GenerationRequest) -> SamplingParams:
    """The request's sampler settings over Sprig's defaults."""
    given: dict[str, Any] = {
        "temperature": request.temperature,
        "top_p": request.top_p,
        "top_k": request.top_k,
        "min_p": request.min_p,
        "presence_penalty": request.presence_penalty,
        "frequency_penalty": request.frequency_penalty,
        "repeat_penalty": request.repetition_penalty or request.repeat_penalty,
        "seed": request.seed,
    }
    return replace(SamplingParams(), **{k: v for k, v in given.items() if v is not None})


def _logit_bias(served: ServedModel, request: GenerationRequest) -> dict[int, float]:
    """The request's logit_bias with token ids as ints; 400 for a key that is no token id."""
    vocab = served.loaded.config.vocab_size
    bias: dict[int, float] = {}
    for key, value in (request.logit_bias or {}).items():
        if not key.isdecimal() or int(key) >= vocab:
            raise APIError(
                400, f"logit_bias has the key {key!r}, which is not a token id (0 to {vocab - 1}).", param="logit_bias"
            )
        bias[int(key)] = value
    return bias


def _options(served: ServedModel, request: GenerationRequest, top_logprobs: int | None) -> dict[str, Any]:
    """The Plan fields of n, logit_bias and logprobs."""
    return {"logit_bias": _logit_bias(served, request), "top_logprobs": top_logprobs, "n": request.n}


def _max_tokens(served: ServedModel, prompt: list[int], requested: int | None) -> int:
    """The answer's token budget; 400 `context_length_exceeded` when prompt and budget cannot fit."""
    room = served.n_ctx - len(prompt)
    if room < 1 or (requested is not None and requested > room):
        wanted = f" plus max_tokens {requested}" if requested is not None else ""
        raise APIError(
            400,
            f"This model's context is {served.n_ctx} tokens; the prompt has {len(prompt)} "
            f"tokens{wanted}. Shorten the messages or lower max_tokens.",
            code="context_length_exceeded",
            param="messages",
        )
    return requested if requested is not None else room


def _template_message(message) -> dict:
    out: dict = {"role": "system" if message.role == "developer" else message.role, "content": message.text()}
    if message.name:
        out["name"] = message.name
    if message.tool_call_id:
        out["tool_call_id"] = message.tool_call_id
    if message.tool_calls:
        out["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.function.name, "arguments": _arguments(call.function.arguments)},
            }
            for call in message.tool_calls
        ]
    return out


def _arguments(text: str) -> dict | str:
    """Arguments as a mapping where they are JSON (templates write them with `tojson`)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return text
    return value if isinstance(value, dict) else text


def _grammar(served: ServedModel, request: ChatCompletionRequest) -> tuple[str | None, bool]:
    """The grammar the answer must follow, and whether tool calls are to be parsed from it."""
    tools = request.tools if request.tool_choice != "none" else None
    if tools:
        choice = request.tool_choice
        if choice is None or choice == "auto":  # the model decides; a call it writes is parsed
            return None, True
        if choice == "required":
            chosen = tools
        else:
            assert isinstance(choice, NamedToolChoice)
            chosen = [t for t in tools if t.function.name == choice.function.name]
            if not chosen:
                raise APIError(
                    400,
                    f"tool_choice names {choice.function.name!r}, which is not among the tools.",
                    param="tool_choice",
                )
        schemas = [call_schema(t.function.name, t.function.parameters, served.call_style) for t in chosen]
        return tool_call_grammar(schemas, served.call_style), True
    response_format = request.response_format
    if response_format is None or response_format.type == "text":
        return None, False
    if response_format.type == "json_object":
        return json_schema_grammar({"type": "object"}), False
    if response_format.json_schema is None:
        raise APIError(400, "response_format json_schema needs a json_schema object.", param="response_format")
    return json_schema_grammar(response_format.json_schema.schema_), False


def plan_chat(served: ServedModel, request: ChatCompletionRequest) -> Plan:
    """Check a chat request and turn it into a Plan (raises APIError)."""
    loaded = served.loaded
    tools = (
        [t.model_dump(exclude_none=True) for t in request.tools]
        if request.tools and request.tool_choice != "none"
        else None
    )
    messages, answer_start = [_template_message(m) for m in request.messages], ""
    if request.continue_final_message:
        if request.add_generation_prompt or messages[-1]["role"] != "assistant":
            raise APIError(
                400,
                "continue_final_message goes on with a last message from the assistant, and needs "
                "add_generation_prompt set to false.",
                param="continue_final_message",
            )
        answer_start = messages.pop()["content"]
    try:
        prompt = chat_prompt_tokens(loaded, messages, answer_start, tools=tools)
        grammar, parse_tools = _grammar(served, request)
        if grammar is not None:
            check_grammar(grammar, loaded.tokenizer, served.stop_ids)
    except SprigError as exc:
        raise APIError(400, str(exc), param="response_format" if isinstance(exc, GrammarError) else "messages") from exc
    max_tokens = _max_tokens(served, prompt, request.max_completion_tokens or request.max_tokens)
    if request.top_logprobs is not None and not request.logprobs:
        raise APIError(400, "top_logprobs needs logprobs set to true.", param="top_logprobs")
    top_logprobs = (request.top_logprobs or 0) if request.logprobs else None
    stops = served.chat_stops
    return Plan(
        prompt,
        sampling_params(request),
        max_tokens,
        [*stops["stop_strings"], *request.stop_strings()],
        set(stops["stop_ids"]),
        grammar,
        parse_tools,
        **_options(served, request, top_logprobs),
    )


def plan_completion(served: ServedModel, request: CompletionRequest) -> Plan:
    """Check a text completion request and turn it into a Plan (raises APIError)."""
    text = request.prompt if isinstance(request.prompt, str) else request.prompt[0]
    prompt = served.loaded.tokenizer.encode(text, parse_special=True)
    if not prompt:
        raise APIError(400, "The prompt is empty.", param="prompt")
    max_tokens = _max_tokens(served, prompt, request.max_tokens if request.max_tokens is not None else 16)
    options = _options(served, request, request.logprobs)
    return Plan(prompt, sampling_params(request), max_tokens, request.stop_strings(), **options)


def make_sampler(served: ServedModel, plan: Plan) -> Sampler:
    """The sampler of a plan: grammar-guided or plain, inside an OptionSampler when the plan
    has logit_bias or asks for log-probabilities."""
    sampler = (
        GuidedSampler(plan.params, plan.grammar, served.loaded.tokenizer, served.stop_ids)
        if plan.grammar is not None
        else Sampler(plan.params)
    )
    if plan.logit_bias or plan.top_logprobs is not None:
        return OptionSampler(sampler, plan.logit_bias, plan.top_logprobs)
    return sampler


def _run(served: ServedModel, plan: Plan, sampler: Sampler):
    """The function of a cancel flag that the scheduler runs for `plan`, on a cache of the pool."""
    loaded = served.loaded

    def run(cancel: threading.Event) -> Iterator[GenerationEvent]:
        cache = served.caches.acquire(plan.prompt)
        try:
            yield from generate(
                loaded.model,
                loaded.tokenizer,
                cache,
                plan.prompt,
                plan.params,
                max_tokens=plan.max_tokens,
                stop_strings=plan.stop_strings,
                stop_ids=plan.stop_ids,
                cancel=cancel,
                sampler=sampler,
            )
        finally:
            served.caches.release(cache)

    return run


async def on_scheduler(served: ServedModel, work: Callable[[], Any]) -> Any:
    """Run `work()` on the scheduler (the thread that owns the model, between batched steps)
    and return its result; APIError 429 when the queue is full, 503 when the model is going."""
    loop = asyncio.get_running_loop()
    results: asyncio.Queue = asyncio.Queue()

    def run(cancel: threading.Event) -> Iterator[Any]:
        yield work()

    def deliver(item: Any) -> None:
        loop.call_soon_threadsafe(results.put_nowait, item)

    _submit(served, Ticket(run, deliver, SERVER))
    item = await results.get()
    if isinstance(item, BaseException):
        raise item
    return item


def _submit(served: ServedModel, ticket: Ticket) -> None:
    try:
        served.scheduler.submit(ticket)
    except QueueFull as exc:
        raise APIError(
            429,
            f"The server is busy ({exc}); retry shortly.",
            code="queue_full",
            headers={"Retry-After": RETRY_AFTER_SECONDS},
        ) from exc
    except SchedulerClosed as exc:
        raise APIError(
            503, "The model is being unloaded; retry shortly.", headers={"Retry-After": RETRY_AFTER_SECONDS}
        ) from exc


class Generation:
    """One plan on the scheduler, its events handed to the event loop.

    `start` queues it (raising APIError 429 when the queue is full, before any answer has
    begun); iterating `events()` yields its events. Leaving that loop early, or `stop()`,
    ends the generation within one decode step; a request still waiting never starts.
    """

    def __init__(self, served: ServedModel, plan: Plan):
        self.served, self.plan = served, plan
        self.sampler = make_sampler(served, plan)
        self.cancel = threading.Event()
        self._queue: asyncio.Queue = asyncio.Queue()
        self._loop = asyncio.get_running_loop()
        self.ticket = Ticket(_run(served, plan, self.sampler), self._deliver, SERVER, self.cancel)

    def _deliver(self, item) -> None:  # on the ticket's thread
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the event loop is gone: nobody is listening any more
            self.cancel.set()

    def start(self) -> None:
        """Queue the generation (APIError 429 when the queue is full, 503 when the model is going)."""
        _submit(self.served, self.ticket)

    def stop(self) -> None:
        """Cancel: a running generation stops after its current step, a waiting one never starts."""
        self.cancel.set()
        self.served.scheduler.wake()

    async def events(self) -> AsyncIterator[GenerationEvent]:
        """The generation's events, as the scheduler produces them."""
        try:
            while True:
                item = await self._queue.get()
                if item is END:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self.stop()


FINISH_REASONS = {FINISH_LENGTH: "length", FINISH_CONTEXT_FULL: "length"}


def finish_reason(event: GenerationEvent | None) -> str | None:
    """OpenAI's finish reason for the engine's (None for a cancelled or unfinished answer)."""
    if event is None or event.finish_reason is None or event.finish_reason == FINISH_CANCELLED:
        return None
    return FINISH_REASONS.get(event.finish_reason, "stop")


def usage(plan: Plan, lasts: list[GenerationEvent | None]) -> dict:
    """OpenAI's usage object: prompt, completion (summed over the choices) and cached prompt tokens."""
    completion = sum(last.metrics.decode_tokens for last in lasts if last)
    first = lasts[0] if lasts else None
    prefilled = first.metrics.prefill_tokens if first else len(plan.prompt)
    return {
        "prompt_tokens": len(plan.prompt),
        "completion_tokens": completion,
        "total_tokens": len(plan.prompt) + completion,
        "prompt_tokens_details": {"cached_tokens": len(plan.prompt) - prefilled},
    }
