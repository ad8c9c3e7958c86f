"""`engine.open_model`: the one call that opens a model for the app, the server and the CLI.

Tiny synthetic models (tests/gguf_factory.py) on the NumPy backend: with and without a draft
model, with a template set for the model, broken files, a memory verdict that refuses, and a
model on a loopback server. The last tests check that the app, `engine serve` and the CLI
all open their models through it.
"""

import threading
from dataclasses import replace

import pytest

import engine
from engine import opening
from engine.chat_session import ChatSession
from engine.cli import main
from engine.errors import DraftModelError, ModelFileError, OutOfMemory, RemoteError, TemplateError
from engine.loader import load_model
from engine.model_info import read_model_info
from engine.model_uri import local_uri, remote_uri
from engine.opening import OpenSettings, open_model
from engine.sampling import SamplingParams
from engine.server.app import ServerConfig, ServerState
from engine.server.completions import ServedModel
from engine.server.scheduler import Scheduler
from engine.server.serve import BackgroundServer
from tests.engine.remote.faulty_server import FaultyServer
from tests.gguf_factory import tiny_vocab, write_mamba_model, write_tiny_model

NUMPY = OpenSettings(backend="numpy", speculative="off")
HI = [{"role": "user", "content": "Hi"}]
# A template of our own, unlike the file's ChatML: what it renders is written out by hand below.
PLAIN_TEMPLATE = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}[assistant]"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A tiny Qwen3 model, a smaller one over the same vocabulary (a draft), one whose vocabulary
    differs at token 270 (no draft), and one with no chat template of its own."""
    folder = tmp_path_factory.mktemp("open")
    tokens, _ = tiny_vocab(288)
    return {
        "model": write_tiny_model(folder / "model.gguf", seed=0, **{"qwen3.context_length": 1024}),
        "draft": write_tiny_model(folder / "draft.gguf", n_layers=1, seed=1),
        "wrong": write_tiny_model(
            folder / "wrong.gguf", seed=2, **{"tokenizer.ggml.tokens": [*tokens[:270], "renamed", *tokens[271:]]}
        ),
        "no-template": write_tiny_model(
            folder / "bare.gguf", arch="llama", seed=3, **{"tokenizer.chat_template": None}
        ),
    }


@pytest.fixture
def opened_files(monkeypatch):
    """Every GGUF file and loaded model `open_model` opens in the test, to check what was closed."""
    seen: dict[str, list] = {"files": [], "models": []}

    def spy(name, key):
        real = getattr(opening, name)

        def wrapper(*args, **kwargs):
            made = real(*args, **kwargs)
            seen[key].append(made)
            return made

        monkeypatch.setattr(opening, name, wrapper)

    spy("open_gguf", "files")
    spy("load_model", "models")
    return seen


def closed(model_file) -> bool:
    """Whether a GGUFFile was closed (its tensor views dropped: `GGUFFile.close`)."""
    return model_file.tensors == {}


def greedy_answer(session: ChatSession, text: str = "Hi") -> tuple[str, object]:
    """The session's greedy answer to `text`, and its last event's metrics."""
    session.params = SamplingParams.greedy()
    events = list(session.send(text))
    return "".join(e.text for e in events), events[-1].metrics


def test_a_tiny_model_opens_ready_to_chat_as_load_model_would(files):
    stages: list[tuple[float, str]] = []
    opened = engine.open_model(files["model"], NUMPY, progress=lambda f, s: stages.append((f, s)))
    reference = load_model(files["model"], "numpy")  # the loader alone, without the planning around it
    try:
        assert opened.name == "tiny-qwen3" and opened.uri == local_uri(files["model"])
        assert opened.backend_name == "numpy" and opened.loaded is not None and opened.info is not None
        assert opened.info.architecture == "qwen3" and opened.draft is None and opened.remote is None
        assert opened.memory is not None and opened.memory.fits and opened.memory.backend == "numpy"
        assert stages[0][0] == 0.0 and stages[-1] == (1.0, "Ready")
        assert opened.notes == []  # an ordinary file: nothing to say
        assert opened.tokenizer.encode("Hi there") == reference.tokenizer.encode("Hi there")
        assert opened.template.render(HI) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"  # the file's
        session = opened.new_session(n_ctx=256, max_tokens=8)
        assert session.cache.n_ctx == 256 and session.speculation is not None and not session.speculation.enabled
        plain = ChatSession(reference, n_ctx=256, max_tokens=8)
        assert greedy_answer(session)[0] == greedy_answer(plain)[0]
    finally:
        opened.close()
        reference.close()
    assert opened.loaded is None


def test_a_draft_model_is_loaded_checked_and_drafts(files):
    settings = replace(NUMPY, speculative="draft", draft_model=files["draft"], draft_tokens=3)  # 3 drafts a round
    opened = open_model(files["model"], settings)
    try:
        assert opened.draft is not None and opened.draft.path == files["draft"]
        assert opened.speculation is not None and opened.speculation.mode == "draft"
        assert opened.speculation.draft is opened.draft
        session = opened.new_session(n_ctx=256, max_tokens=12)
        assert session.speculation is not None and session.speculation.draft is opened.draft
        text, metrics = greedy_answer(session)
        assert metrics.draft_rounds > 0 and metrics.drafted_tokens > 0  # the draft model drafted
        plain = opened.new_session(n_ctx=256, max_tokens=12, speculative="off")
        assert text == greedy_answer(plain)[0]  # greedy speculation gives the plain answer
    finally:
        opened.close()


def test_a_draft_that_cannot_draft_is_an_error_and_nothing_stays_open(files, opened_files):
    settings = replace(NUMPY, speculative="draft", draft_model=files["wrong"])
    with pytest.raises(DraftModelError, match=r"wrong\.gguf cannot draft for model\.gguf: token 270 differs"):
        open_model(files["model"], settings)
    assert len(opened_files["models"]) == 2  # the model and the draft were loaded, then both closed
    assert all(closed(loaded.file) for loaded in opened_files["models"])


def test_an_optional_draft_that_cannot_draft_is_a_note(files):
    heard: list[str] = []
    settings = replace(NUMPY, speculative="draft", draft_model=files["wrong"], draft_optional=True)
    opened = open_model(files["model"], settings, on_note=heard.append)
    try:
        assert opened.draft is None and opened.speculation is not None and opened.speculation.mode == "auto"
        assert len(heard) == 1 and heard == opened.notes
        assert heard[0].startswith("tiny-qwen3 answers without its draft model: ") and "token 270 differs" in heard[0]
    finally:
        opened.close()


def test_the_template_set_for_the_model_wins_over_the_files(files):
    opened = open_model(files["model"], replace(NUMPY, template=PLAIN_TEMPLATE, name="Tiny"))
    try:
        rendered = opened.template.render([{"role": "system", "content": "Be brief."}, *HI])
        assert rendered == "[system] Be brief.\n[user] Hi\n[assistant]"
        assert opened.name == "Tiny"
    finally:
        opened.close()


def test_a_file_without_a_template_gets_its_familys_and_says_so(files):
    opened = open_model(files["no-template"], NUMPY)
    try:
        assert opened.template.guessed  # the built-in format of its family
        assert any("has no chat template of its own" in note for note in opened.notes)
    finally:
        opened.close()
    overridden = open_model(files["no-template"], replace(NUMPY, template=PLAIN_TEMPLATE))
    try:
        assert overridden.template.render(HI) == "[user] Hi\n[assistant]" and overridden.notes == []
    finally:
        overridden.close()


def test_a_broken_template_setting_fails_the_open_and_closes_the_model(files, opened_files):
    with pytest.raises(TemplateError):
        open_model(files["model"], replace(NUMPY, template="{% for m in messages %}"))
    (loaded,) = opened_files["models"]
    assert closed(loaded.file)


def test_a_corrupt_file_is_a_clear_error_and_nothing_is_loaded(files, tmp_path, opened_files):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUF" + bytes(60))
    with pytest.raises(ModelFileError, match=r"junk\.gguf"):
        open_model(junk, NUMPY)
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(files["model"].read_bytes()[: files["model"].stat().st_size // 2])
    with pytest.raises(ModelFileError, match=r"truncated\.gguf"):
        open_model(truncated, NUMPY)
    with pytest.raises(ModelFileError, match=r"missing\.gguf"):
        open_model(tmp_path / "missing.gguf", NUMPY)
    assert opened_files["models"] == []  # no backend was started for any of them


def test_an_unsupported_architecture_is_refused_with_the_file_closed(tmp_path, opened_files):
    rooms: list = []
    with pytest.raises(ModelFileError, match="mamba"):
        open_model(write_mamba_model(tmp_path / "mamba.gguf"), NUMPY, make_room=rooms.append)
    (model_file,) = opened_files["files"]
    assert closed(model_file) and opened_files["models"] == [] and rooms == []


def test_a_memory_verdict_that_refuses_loads_nothing_and_keeps_the_current_model(files, monkeypatch, opened_files):
    monkeypatch.setattr(opening, "available_memory", lambda: 100_000)  # 100 kB free: less than the file
    rooms: list = []
    with pytest.raises(OutOfMemory, match=r"tiny-qwen3 needs .* of 100 kB available: it will not fit"):
        open_model(files["model"], NUMPY, make_room=rooms.append)
    (model_file,) = opened_files["files"]
    assert closed(model_file) and opened_files["models"] == []
    assert rooms == []  # the caller's model was not let go for a load that could not happen


def test_room_is_made_only_where_both_models_do_not_fit(files, monkeypatch):
    info = read_model_info(files["model"])
    needed = info.memory_needed(opening.DEFAULT_CONTEXT, "numpy", NUMPY.kv_type)
    rooms: list = []
    monkeypatch.setattr(opening, "available_memory", lambda: needed - 1)  # alone it would not fit...
    opened = open_model(files["model"], NUMPY, reclaimable=needed, make_room=rooms.append)  # ...with the old gone
    opened.close()
    assert [r.path for r in rooms] == [files["model"]]
    assert opened.memory is not None and opened.memory.available == 2 * needed - 1 and not opened.memory.keep_current
    monkeypatch.setattr(opening, "available_memory", lambda: 2 * needed)
    open_model(files["model"], NUMPY, reclaimable=needed, make_room=rooms.append).close()
    assert len(rooms) == 1  # both fit: the current model stayed


def test_a_model_that_only_runs_slowly_opens_with_a_note(files, monkeypatch):
    info = read_model_info(files["model"])
    # NumPy keeps a float32 copy of the weights where memory allows; where it does not, it runs, slowly.
    kv = info.footprint(NUMPY.kv_type).kv_bytes(opening.DEFAULT_CONTEXT)
    monkeypatch.setattr(opening, "available_memory", lambda: info.file_size + kv)
    opened = open_model(files["model"], NUMPY)
    opened.close()
    assert opened.memory is not None and not opened.memory.fits
    assert opened.notes[0].startswith("tiny-qwen3 needs ") and "slowly" in opened.notes[0]


@pytest.fixture
def sprig_server(files):
    """The tiny model, opened by `open_model` and served on loopback as `engine serve` serves it."""
    opened = open_model(files["model"], NUMPY)
    scheduler = Scheduler()
    server = BackgroundServer(ServerState(ServedModel(opened.local, scheduler, "tiny", 256)), ServerConfig(port=0))
    server.start()
    yield server, opened
    server.stop()
    scheduler.close()
    opened.close()


def test_a_remote_endpoint_opens_as_a_chat_engine_that_answers_as_the_model(sprig_server):
    server, local = sprig_server
    opened = open_model(remote_uri(server.url, "tiny"), OpenSettings(api_key=None))
    try:
        assert opened.remote is not None and opened.loaded is None and opened.backend_name == "remote"
        assert (opened.name, opened.uri) == ("tiny", remote_uri(server.url, "tiny"))
        with pytest.raises(RemoteError, match="runs on a server"):
            _ = opened.tokenizer
        events = list(opened.remote.stream(HI, SamplingParams.greedy(), 8, threading.Event()))
        remote_text = "".join(e.text for e in events)
    finally:
        opened.close()
    assert opened.remote is None
    local_session = local.new_session(n_ctx=256, max_tokens=8)
    assert remote_text == greedy_answer(local_session)[0]  # the same model, over HTTP


def test_a_remote_endpoints_failure_is_its_clear_error():
    faulty = FaultyServer()
    try:
        opened = open_model(remote_uri(faulty.url("401"), "m"), OpenSettings(api_key="sk-wrong"))
        with pytest.raises(RemoteError, match="401"):
            list(opened.remote.stream(HI, SamplingParams.greedy(), 8, threading.Event()))
        opened.close()
    finally:
        faulty.close()
    with pytest.raises(RemoteError, match="is not a model on a server: write it as openai"):
        open_model("openai+ftp://example#m")


# -- the app, the server and the CLI open through it -------------------------------------------------


@pytest.fixture
def refused(monkeypatch):
    """Memory for no model at all: an opening through `open_model` is refused, saying so."""
    monkeypatch.setattr(opening, "available_memory", lambda: 100_000)


def test_the_cli_opens_through_open_model(files, refused, capsys):
    assert main(["generate", "--model", str(files["model"]), "--backend", "numpy", "--tokens", "1,2"]) == 2
    assert "error: tiny-qwen3 needs" in capsys.readouterr().err


def test_engine_serve_opens_through_open_model(files, refused, capsys):
    assert main(["serve", "--model", str(files["model"]), "--backend", "numpy", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert "error: tiny-qwen3 needs" in err and "will not fit" in err


def test_the_cli_passes_its_options_to_open_model(files, monkeypatch, capsys):
    calls: list[OpenSettings] = []

    def counting(source, settings, **kwargs):
        calls.append(settings)
        return open_model(source, settings, **kwargs)

    monkeypatch.setattr("engine.cli.open_model", counting)
    argv = ["generate", "--model", str(files["model"]), "--backend", "numpy", "--prompt", "Hi", "--max-tokens", "4"]
    assert main([*argv, "--draft-model", str(files["draft"]), "--speculative", "draft", "--ctx", "256"]) == 0
    (settings,) = calls
    assert (settings.draft_model, settings.speculative, settings.context_length) == (str(files["draft"]), "draft", 256)


def test_the_app_opens_through_open_model(qtbot, files, tmp_path, monkeypatch):
    pytest.importorskip("PySide6", reason="the app's model host needs PySide6")
    from app.model_host import ModelHost
    from app.model_settings import ModelSettings
    from app.settings import Settings
    from app.storage import Store
    from app.worker import JobRunner

    settings = replace(Settings.defaults(), backend="numpy", context_length=512, models_folder=tmp_path)
    jobs, store = JobRunner(), Store(":memory:")
    host = ModelHost(jobs, store, lambda: settings)
    try:
        store.set_model_settings(
            files["model"], ModelSettings(template=PLAIN_TEMPLATE, draft_model=str(files["wrong"]))
        )
        with qtbot.waitSignal(host.model_notice, timeout=60_000) as notice:
            assert host.load(files["model"])
        assert "answers without its draft model" in notice.args[0]
        qtbot.waitUntil(lambda: host.session is not None, timeout=60_000)
        assert host.loaded is not None and host.loaded.template.render(HI) == "[user] Hi\n[assistant]"
        assert host.session.cache.n_ctx == 512 and host.draft is None

        monkeypatch.setattr(opening, "available_memory", lambda: 100_000)
        # larger than the memory left even with the loaded model let go
        other = write_tiny_model(tmp_path / "other.gguf", n_layers=4, d_model=256, n_heads=8, head_dim=32, d_ff=1024)
        qtbot.waitUntil(lambda: not jobs.busy, timeout=60_000)
        with qtbot.waitSignal(host.error, timeout=60_000) as error:
            host.load(other)
        assert "tiny-qwen3 needs" in error.args[0] and "will not fit" in error.args[0]
        qtbot.waitUntil(lambda: not jobs.busy, timeout=60_000)
        assert host.loaded is not None and host.loaded.path == files["model"]  # the chat kept its model
    finally:
        qtbot.waitUntil(lambda: not jobs.busy, timeout=60_000)
        jobs.stop()
        host.close()
        store.close()
