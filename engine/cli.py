"""`python -m engine`: inspect model files, tokenize, render templates, generate, measure.

Every command takes `--model` as a path or a bundled model's key ("smollm2", "gemma3").
Errors print one line to stderr and exit with status 2.
"""

import argparse
import json
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import psutil

from backends.dequant import dequantize
from backends.errors import BackendError
from backends.kv_types import DEFAULT_KV_TYPE, KV_TYPES
from backends.selection import PREFERENCES as BACKENDS
from engine.bench import bench
from engine.bundled import resolve_model_path
from engine.chat_session import answer_stops, chat_prompt_tokens
from engine.chat_template import ChatTemplate
from engine.errors import SprigError
from engine.generation import generate
from engine.gguf_file import open_gguf
from engine.models import read_config
from engine.models.lora import parse_lora_option
from engine.opening import OpenedModel, OpenSettings, RemoteModel, open_model
from engine.perplexity import perplexity
from engine.remote.endpoints import Endpoint, normalize_base_url
from engine.sampling import SamplingParams
from engine.speculation import MODES
from engine.tokenizer import Tokenizer


class UsageError(SprigError):
    """Bad command-line input that argparse cannot see (a missing file, a bad id list)."""


def _print_json(value) -> None:
    print(json.dumps(value, ensure_ascii=False))


def _read_text(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read {path}: {exc}") from exc


def _token_list(text: str) -> list[int]:
    try:
        return [int(t) for t in text.split(",") if t.strip()]
    except ValueError as exc:
        raise UsageError(f"--tokens wants comma-separated integers, got {text!r}") from exc


# -- file commands (issue: foundation) -----------------------------------------------


def cmd_info(args) -> None:
    """Architecture, parameters, tensor types and sizes, context length, template presence."""
    with open_gguf(resolve_model_path(args.model)) as model_file:
        config = read_config(model_file)
        by_type: dict[str, dict[str, int]] = defaultdict(lambda: {"tensors": 0, "elements": 0, "bytes": 0})
        for info in model_file.tensors.values():
            entry = by_type[info.type_name]
            entry["tensors"] += 1
            entry["elements"] += info.n_elements
            entry["bytes"] += info.n_bytes
        report = {
            "file": str(model_file.path),
            "name": model_file.get("general.name"),
            "architecture": config.architecture,
            "parameters": sum(e["elements"] for e in by_type.values()),
            "tensor_types": dict(sorted(by_type.items())),
            "context_length": config.context_length,
            "layers": config.n_layers,
            "embedding_length": config.d_model,
            "vocab_size": config.vocab_size,
            "chat_template": model_file.get("tokenizer.chat_template") is not None,
        }
    if args.json:
        _print_json(report)
        return
    print(f"{report['file']}\n  architecture   {report['architecture']}  ({report['name']})")
    print(f"  parameters     {report['parameters']:,}")
    print(f"  context length {report['context_length']:,}")
    print(f"  chat template  {'yes' if report['chat_template'] else 'no (the built-in format of its family)'}")
    for name, entry in report["tensor_types"].items():
        size = f"{entry['bytes'] / 2**20:10.1f} MiB"
        print(f"  {name:8s} {entry['tensors']:5d} tensors {entry['elements']:>14,} weights {size}")


def cmd_tokenize(args) -> None:
    """Token ids of a text as a JSON list."""
    text = args.text if args.text is not None else _read_text(args.text_file)
    with open_gguf(resolve_model_path(args.model)) as model_file:
        tokenizer = Tokenizer.from_metadata(model_file.metadata, source=model_file.path.name)
    _print_json(tokenizer.encode(text, add_bos=args.bos, parse_special=args.special))


def cmd_tensor(args) -> None:
    """Write one tensor, dequantized to float32, to a .npy file."""
    with open_gguf(resolve_model_path(args.model)) as model_file:
        info = model_file.tensors.get(args.name)
        if info is None:
            raise UsageError(f"{model_file.path.name} has no tensor called {args.name!r}")
        np.save(args.out, dequantize(info.data, info.ggml_type, info.shape))


def cmd_template(args) -> None:
    """Render the model's chat template over messages from a JSON file."""
    try:
        messages = json.loads(_read_text(args.messages_file))
    except json.JSONDecodeError as exc:
        raise UsageError(f"{args.messages_file} is not valid JSON: {exc}") from exc
    with open_gguf(resolve_model_path(args.model)) as model_file:
        template = ChatTemplate.from_metadata(model_file.metadata, origin=model_file.path.name)
    sys.stdout.write(template.render(messages, add_generation_prompt=not args.no_generation_prompt))


# -- generation commands (issue: NumPy engine) -----------------------------------------


def _sampling(args) -> SamplingParams:
    return SamplingParams(
        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p, seed=args.seed
    )


def _open(args) -> OpenedModel:
    """Open --model through `engine.open_model` with the command's options (backend, threads, KV type,
    context, LoRA adapters, speculation and draft model), saying on stderr what the user should know."""
    draft_model, speculative = getattr(args, "draft_model", None), getattr(args, "speculative", "off")
    if draft_model is not None and speculative not in ("draft", "auto"):
        raise UsageError(f"--draft-model needs --speculative draft or auto, not {speculative}")
    settings = OpenSettings(
        backend=args.backend,
        threads=args.threads,
        context_length=getattr(args, "ctx", None),
        kv_type=args.kv_type,
        speculative=speculative,
        draft_model=draft_model,
        draft_tokens=getattr(args, "draft_tokens", None),
        adapters=tuple(parse_lora_option(option) for option in getattr(args, "lora", None) or []),
    )
    return open_model(args.model, settings, on_note=lambda text: print(f"note: {text}", file=sys.stderr))


def _generate_remote(args) -> None:
    """--endpoint: stream a remote server's answer to --prompt to stdout."""
    if args.prompt is None or args.json:
        raise UsageError("--endpoint takes --prompt and prints the answer (--tokens and --json are for local models)")
    base_url = normalize_base_url(args.endpoint)
    opened = open_model(RemoteModel(Endpoint(base_url, base_url), args.model), OpenSettings(api_key=args.api_key))
    assert opened.remote is not None  # a remote source opens as a remote model
    try:
        messages = [{"role": "user", "content": args.prompt}]
        for event in opened.remote.stream(messages, _sampling(args), args.max_tokens, threading.Event()):
            print(event.text, end="", flush=True)
    finally:
        opened.close()
    print()


def cmd_generate(args) -> None:
    """Continue a prompt (through the chat template) or raw token ids; or, with --endpoint, ask a server."""
    if args.endpoint is not None:
        _generate_remote(args)
        return
    opened = _open(args)
    loaded = opened.local
    if args.tokens is not None:
        prompt, stops = _token_list(args.tokens), {}
    else:
        prompt = chat_prompt_tokens(loaded, [{"role": "user", "content": args.prompt}])
        stops = answer_stops(loaded)
    cache = loaded.new_cache(args.ctx)
    text, tokens, last = "", [], None
    for event in generate(
        loaded.model,
        loaded.tokenizer,
        cache,
        prompt,
        _sampling(args),
        max_tokens=args.max_tokens,
        speculation=opened.speculation,
        **stops,
    ):
        text += event.text
        if event.token is not None and event.finish_reason != "stop":
            tokens.append(event.token)
        if not args.json:
            print(event.text, end="", flush=True)
        last = event
    if args.json:
        assert last is not None  # generate always ends with an event that says why
        _print_json(
            {
                "text": text,
                "tokens": tokens,
                "finish_reason": last.finish_reason,
                "metrics": last.metrics.as_dict(),
                "backend": loaded.backend.name,
            }
        )
    else:
        print()


def cmd_chat(args) -> None:
    """An interactive chat in the terminal. Ctrl-C stops an answer; Ctrl-D quits."""
    opened = _open(args)
    loaded = opened.local
    session = opened.new_session(args.ctx, args.max_tokens, args.system, _sampling(args))
    print(f"{loaded.path.name} on {loaded.backend.device_name}. Ctrl-D to quit.", file=sys.stderr)
    while True:
        try:
            line = input("> ")
        except EOFError:
            print()
            return
        cancel = threading.Event()
        try:
            for event in session.send(line, cancel):
                if event.notice:
                    print(f"[{event.notice}]", file=sys.stderr)
                print(event.text, end="", flush=True)
        except KeyboardInterrupt:
            cancel.set()
        print()


def cmd_logits(args) -> None:
    """Last-position logits of raw token ids, float32 (vocab,), to a .npy file."""
    loaded = _open(args).local
    tokens = _token_list(args.tokens)
    cache = loaded.new_cache(len(tokens) + 1)
    logits = loaded.model.forward(np.asarray(tokens, dtype=np.int64), 0, cache.storage)
    np.save(args.out, logits[-1].astype(np.float32))


def cmd_embed(args) -> None:
    """L2-normalised embeddings of texts, pooled as the model file says."""
    from engine.embedding import embed, pooling

    loaded = _open(args).local
    vectors, n_tokens = embed(loaded, args.text, args.ctx)
    if args.json:
        _print_json(
            {
                "pooling": pooling(loaded),
                "tokens": n_tokens,
                "embeddings": [[float(x) for x in v] for v in vectors],
            }
        )
    else:
        for text, vector in zip(args.text, vectors, strict=True):
            head = " ".join(f"{x:+.4f}" for x in vector[:8])
            print(f"{text[:40]!r}: {vector.size} dimensions [{head} ...]")


def cmd_perplexity(args) -> None:
    """Perplexity of a text file with llama.cpp's protocol."""
    loaded = _open(args).local
    result = perplexity(loaded, _read_text(args.text_file), args.ctx, args.max_windows)
    _print_json({"ppl": result.ppl, "tokens_scored": result.tokens_scored})


def cmd_bench(args) -> None:
    """Prefill and decode tokens/s after a warm-up; load time and resident memory."""
    started = time.perf_counter()
    opened = _open(args)
    load_s, rss_after_load = time.perf_counter() - started, psutil.Process().memory_info().rss
    figures = bench(opened.local, args.prompt_tokens, args.gen_tokens, args.repeats, opened.speculation, args.fill)
    figures.update(
        load_s=load_s, rss_bytes={"after_load": rss_after_load, "after_run": psutil.Process().memory_info().rss}
    )
    if args.json:
        _print_json(figures)
    else:
        prefill = "random fill" if figures["prefill_tok_s"] is None else f"prefill {figures['prefill_tok_s']:.1f} tok/s"
        print(
            f"{prefill}, decode {figures['decode_tok_s']:.1f} tok/s, KV {figures['kv_type']} "
            f"({figures['backend']}, {figures['device']}, speculative {figures['speculative']})"
        )


def cmd_serve(args) -> None:
    """An OpenAI-compatible HTTP server for the model (see the README's "Local server")."""
    from engine.server.app import ServerConfig, ServerState
    from engine.server.completions import ServedModel
    from engine.server.scheduler import Scheduler
    from engine.server.security import check_bind
    from engine.server.serve import serve_forever

    check_bind(args.host, args.api_key)
    if args.max_batch < 1:
        raise UsageError(f"--max-batch must be at least 1, not {args.max_batch}")
    config = ServerConfig(host=args.host, port=args.port, api_key=args.api_key, cors_origins=args.cors_origin or [])
    state = ServerState()

    def load(server) -> None:  # while it loads, /health and the API answer 503
        try:
            loaded = _open(args).local
        except (SprigError, BackendError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            server.should_exit = True
            return
        name = args.alias or loaded.path.stem
        state.served = ServedModel(loaded, Scheduler(args.max_waiting, args.max_batch), name, args.ctx)
        print(f"serving {name} on http://{args.host}:{args.port}/v1", file=sys.stderr)

    serve_forever(state, config, on_started=load)
    if state.served is None:
        raise UsageError("the model could not be loaded")


def cmd_pull(args) -> None:
    """Download a model from Hugging Face (owner/name[:QUANT]), checked; print its path."""
    from engine.hub.pull import pull_in_terminal  # imports huggingface_hub only for this command

    print(pull_in_terminal(args.spec, args.cache_dir, args.token))


# -- parser ---------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(prog="python -m engine", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    def command(name, func, needs_backend=False):
        p = sub.add_parser(name, help=func.__doc__.splitlines()[0])
        p.set_defaults(func=func)
        if name != "info":
            p.add_argument("--model", required=True, help="GGUF path, or a bundled model: smollm2, gemma3")
        if needs_backend:
            p.add_argument("--backend", choices=BACKENDS, default="auto")
            p.add_argument(
                "--threads", type=int, default=None, help="threads of the cpu backend (default: the physical cores)"
            )
            p.add_argument(
                "--kv-type",
                choices=KV_TYPES,
                default=DEFAULT_KV_TYPE,
                help="what the KV cache stores keys and values as: f16 (default), q8_0 (8-bit blocks), f32 (checks)",
            )
        return p

    p = command("info", cmd_info)
    p.add_argument("model", help="GGUF path, or a bundled model: smollm2, gemma3")
    p.add_argument("--json", action="store_true")

    p = command("tokenize", cmd_tokenize)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--text")
    source.add_argument("--text-file")
    p.add_argument("--special", action="store_true", help="parse special-token text such as <|im_start|>")
    p.add_argument("--bos", action="store_true", help="add the BOS token")
    p.add_argument("--json", action="store_true", help="print JSON (the only format)")

    p = command("tensor", cmd_tensor)
    p.add_argument("--name", required=True)
    p.add_argument("--out", required=True)

    p = command("template", cmd_template)
    p.add_argument("--messages-file", required=True)
    p.add_argument("--no-generation-prompt", action="store_true")

    def speculative_options(p, default):
        p.add_argument(
            "--speculative",
            choices=MODES,
            default=default,
            help=f"speculative decoding (default {default}): auto drafts only where it pays",
        )
        p.add_argument("--draft-model", default=None, help="GGUF path or bundled key of a draft model")
        p.add_argument("--draft-tokens", type=int, default=None, help="a fixed draft length (default: adaptive)")

    def lora_options(p):
        p.add_argument(
            "--lora",
            action="append",
            metavar="FILE[:SCALE]",
            help="a LoRA adapter GGUF applied at run time, with its scale (default 1); repeatable",
        )

    def sampling_options(p, max_tokens):
        p.add_argument("--max-tokens", type=int, default=max_tokens)
        p.add_argument("--temperature", type=float, default=0.0)
        p.add_argument("--top-k", type=int, default=40)
        p.add_argument("--top-p", type=float, default=0.95)
        p.add_argument("--min-p", type=float, default=0.05)
        p.add_argument("--seed", type=int, default=None)
        p.add_argument("--ctx", type=int, default=None, help="context length (default 4096)")

    p = command("generate", cmd_generate, needs_backend=True)
    prompt = p.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", help="a user message, rendered through the chat template")
    prompt.add_argument("--tokens", help="comma-separated ids, used as given")
    sampling_options(p, 128)
    speculative_options(p, "auto")
    lora_options(p)
    p.add_argument("--json", action="store_true")
    p.add_argument("--endpoint", default=None, help="an OpenAI-compatible server's base URL (…/v1); --model is its id")
    p.add_argument("--api-key", default=None, help="the server's API key (with --endpoint)")

    p = command("chat", cmd_chat, needs_backend=True)
    p.add_argument("--system", default=None, help="system prompt")
    sampling_options(p, 512)
    speculative_options(p, "auto")
    lora_options(p)
    p.set_defaults(temperature=0.7)

    p = command("logits", cmd_logits, needs_backend=True)
    p.add_argument("--tokens", required=True)
    p.add_argument("--out", required=True)

    p = command("embed", cmd_embed, needs_backend=True)
    p.add_argument("--text", action="append", required=True, help="a text to embed (repeatable)")
    p.add_argument("--ctx", type=int, default=None, help="most tokens per text (default: the model's context)")
    p.add_argument("--json", action="store_true")

    p = command("perplexity", cmd_perplexity, needs_backend=True)
    p.add_argument("--text-file", required=True)
    p.add_argument("--ctx", type=int, default=256)
    p.add_argument("--max-windows", type=int, default=None)
    p.add_argument("--json", action="store_true", help="print JSON (the only format)")

    p = command("serve", cmd_serve, needs_backend=True)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (other than loopback: needs --api-key)")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY'")
    p.add_argument("--alias", default=None, help="the model's name in the API (default: the file name)")
    p.add_argument("--cors-origin", action="append", metavar="URL", help="a web origin allowed to call (repeatable)")
    p.add_argument("--ctx", type=int, default=None, help="context length of server requests (default 4096)")
    p.add_argument("--max-waiting", type=int, default=16, help="requests that may wait; more get 429")
    p.add_argument("--max-batch", type=int, default=4, help="requests decoded together in one batched step")
    lora_options(p)

    p = sub.add_parser("pull", help="download a model from Hugging Face, checked; print its path")
    p.set_defaults(func=cmd_pull)
    p.add_argument("spec", metavar="owner/name[:QUANT]", help="a GGUF repository, and a quantization (default Q4_K_M)")
    p.add_argument("--cache-dir", type=Path, default=None, help="the Hugging Face cache (default: HF_HUB_CACHE)")
    p.add_argument("--token", action="store_true", help="ask for an access token (gated models); kept in the keyring")

    p = command("bench", cmd_bench, needs_backend=True)
    p.add_argument("--prompt-tokens", type=int, default=256)
    p.add_argument("--gen-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument(
        "--fill",
        choices=("prefill", "random"),
        default="prefill",
        help="put the prompt in the KV cache by a prefill, or with random keys and values (decode at depth, quickly)",
    )
    speculative_options(p, "off")
    p.add_argument("--json", action="store_true")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; engine errors become one stderr line and exit status 2."""
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except (SprigError, BackendError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0
