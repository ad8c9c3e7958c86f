"""Saved conversation states: a restored cache gives the logits of one that read the text
again; damaged, hostile, foreign or mismatched files are refused and never loaded; the
folder stays under its cap, dropping the least recently used first."""

import hashlib
import importlib.util
import json
import logging
import os
import struct
from dataclasses import replace

import numpy as np
import pytest

import engine.models.attention
import engine.saved_state
from backends.base import AttentionState, RecurrentState
from backends.numpy_backend import NumpyBackend
from engine.chat_session import ChatSession
from engine.kv_cache import KVCache
from engine.loader import load_model
from engine.sampling import SamplingParams
from engine.saved_state import (
    MAGIC,
    ConversationState,
    Identity,
    SavedStates,
    identity_of,
    model_fingerprint,
    read_header,
)
from tests.gguf_factory import write_tiny_model

N_CTX = 128
GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def model_paths(tmp_path_factory):
    folder = tmp_path_factory.mktemp("saved")
    return write_tiny_model(folder / "a.gguf", arch="llama"), write_tiny_model(folder / "b.gguf", arch="llama", seed=1)


NO_MLX = importlib.util.find_spec("mlx") is None
BACKENDS = ["numpy", "cpu", pytest.param("mlx", marks=pytest.mark.skipif(NO_MLX, reason="mlx is not installed"))]


@pytest.fixture(params=BACKENDS)
def loaded(request, model_paths):
    model = load_model(model_paths[0], backend=request.param)
    yield model
    model.close()


def prompt_tokens(n: int, seed: int = 0) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(3, 280, size=n)]


def saved_cache(loaded, tokens, tmp_path) -> tuple[SavedStates, Identity]:
    states, identity = SavedStates(tmp_path / "states"), identity_of(loaded.path, loaded.model)
    cache = loaded.new_cache(N_CTX)
    cache.feed(loaded.model, tokens)
    assert states.save("c1", cache, identity)
    return states, identity


@pytest.mark.parametrize("chunk", [4 << 20, 3000])
def test_a_restored_cache_gives_the_logits_of_the_text_read_again(loaded, tmp_path, monkeypatch, chunk):
    monkeypatch.setattr(engine.saved_state, "CHUNK", chunk)  # one piece per array, or many
    tokens = prompt_tokens(60)
    states, identity = saved_cache(loaded, tokens[:50], tmp_path)
    reread = loaded.new_cache(N_CTX)
    reread.feed(loaded.model, tokens[:50])
    expected = reread.feed(loaded.model, tokens[50:], all_logits=True)  # (10, vocab)

    restored = loaded.new_cache(N_CTX)
    assert states.restore("c1", restored, tokens, identity).tokens == 50
    assert restored.tokens == tuple(tokens[:50])
    got = restored.feed(loaded.model, tokens[50:], all_logits=True)
    assert np.array_equal(got, expected)  # the same state, the same kernels: bit for bit
    whole = loaded.new_cache(N_CTX).feed(loaded.model, tokens, all_logits=True)[50:]  # read in one pass
    np.testing.assert_allclose(got, whole, rtol=0, atol=1e-4)


def test_a_prefix_is_restored_and_the_rest_forgotten(loaded, tmp_path):
    tokens = prompt_tokens(60)
    states, identity = saved_cache(loaded, tokens[:50], tmp_path)
    edited = tokens[:30] + prompt_tokens(10, seed=5)  # the conversation diverged at token 30
    restored = loaded.new_cache(N_CTX)
    assert states.restore("c1", restored, edited, identity).tokens == 30
    got = restored.feed(loaded.model, edited[30:])
    kept = loaded.new_cache(N_CTX)  # what the cache does when it held the conversation all along
    kept.feed(loaded.model, tokens[:50])
    kept.truncate(30)
    assert np.array_equal(got, kept.feed(loaded.model, edited[30:]))
    reread = loaded.new_cache(N_CTX).feed(loaded.model, edited)  # the whole text read again, in one pass
    np.testing.assert_allclose(got, reread, rtol=0, atol=1e-4)


def test_rings_and_recurrent_arrays_come_back_bit_for_bit(tmp_path, monkeypatch):
    monkeypatch.setattr(engine.saved_state, "CHUNK", 100)  # many pieces per array, the last one short

    class Layers:  # what KVCache needs of a model: its backend and each layer's state
        backend = NumpyBackend()

        def layer_states(self, n_ctx):
            return [
                AttentionState(2, 4, 4, n_ctx),
                AttentionState(2, 4, 4, 12, window=8),
                RecurrentState(((3, 5), (7,))),
            ]

    rng = np.random.default_rng(3)
    saved = KVCache(Layers(), 32)
    for array in saved.backend.state_arrays(saved.storage):
        array[...] = rng.standard_normal(array.shape)
    saved.adopt(range(20))
    states = SavedStates(tmp_path)
    identity = Identity("model", "numpy")
    assert states.save("r", saved, identity)
    restored = KVCache(Layers(), 32)
    restored.rewind_limit = 0  # a recurrent layer: only the whole of it can be used
    assert states.restore("r", restored, [*range(20), 99], identity).tokens == 20
    for a, b in zip(
        saved.backend.state_arrays(saved.storage), restored.backend.state_arrays(restored.storage), strict=True
    ):
        assert np.array_equal(a, b)
    assert states.restore("r", KVCache(Layers(), 32), [*range(19), 99], identity).tokens == 0  # not the whole of it


@pytest.mark.parametrize("used", [192, 100, 0])
def test_the_unused_context_takes_no_room_and_everything_comes_back(tmp_path, monkeypatch, used):
    """Only blocks holding a nonzero byte are stored: the file of a cache of 256 positions
    with `used` of them filled is the filled part's size, plus a bit per block and the
    header; every byte comes back, zeros included (the restored cache held other data)."""
    monkeypatch.setattr(engine.saved_state, "CHUNK", 3 * 4096 + 1000)  # pieces end inside blocks, and in a short one

    class Layers:
        backend = NumpyBackend()

        def layer_states(self, n_ctx):
            return [AttentionState(2, 64, 64, n_ctx, kv_type="f16")]  # keys, values: (2, n_ctx, 64) float16

    rng = np.random.default_rng(4)
    saved = KVCache(Layers(), 256)
    arrays = saved.backend.state_arrays(saved.storage)
    for array in arrays:
        array[:, :used] = rng.standard_normal((2, used, 64))
        array[:, :used][array[:, :used] == 0] = 1.0  # no zero value inside the filled part
    saved.adopt(range(max(used, 1)))
    states, identity = SavedStates(tmp_path), Identity("model", "numpy")
    assert states.save("k", saved, identity)
    header = read_header(states.path("k"))
    stored = sum(chunk[1] for entry in header["arrays"] for chunk in entry["chunks"])
    filled = 2 * 2 * used * 64 * 2  # 2 arrays, 2 heads, `used` positions of 64 float16
    blocks = -(-filled // 4096) + 2 * 2 * 2  # the filled part's blocks; each head's may straddle one more
    assert filled <= stored <= blocks * 4096 + 2 * 8  # and the bitmaps, a few bytes per piece
    restored = KVCache(Layers(), 256)
    for array in restored.backend.state_arrays(restored.storage):
        array[...] = 7.0  # what the zeros must overwrite
    assert states.restore("k", restored, [*range(max(used, 1)), 7], identity).tokens == max(used, 1)
    for a, b in zip(arrays, restored.backend.state_arrays(restored.storage), strict=True):
        assert a.view(np.uint8).tobytes() == b.view(np.uint8).tobytes()


def test_a_sliding_window_models_state_restores(tmp_path, monkeypatch):
    monkeypatch.setattr(engine.models.attention, "RING_SLACK", 8)
    loaded = load_model(write_tiny_model(tmp_path / "g3.gguf", arch="gemma3", n_layers=6), backend="cpu")
    tokens = prompt_tokens(50)
    states, identity = saved_cache(loaded, tokens[:40], tmp_path)
    restored = loaded.new_cache(N_CTX)
    assert states.restore("c1", restored, tokens, identity).tokens == 40
    reread = loaded.new_cache(N_CTX)
    reread.feed(loaded.model, tokens[:40])
    assert np.array_equal(restored.feed(loaded.model, tokens[40:]), reread.feed(loaded.model, tokens[40:]))
    loaded.close()


# -- refused files ----------------------------------------------------------------------


def refused(states, loaded, prompt, identity, caplog, why: str) -> None:
    """The file is refused with a note naming `why`, and the cache is left as it was."""
    cache = loaded.new_cache(N_CTX)
    cache.feed(loaded.model, prompt[:3])
    with caplog.at_level(logging.WARNING, logger="engine.saved_state"):
        restored = states.restore("c1", cache, prompt, identity)
    assert restored.tokens == 0 and why in restored.refused
    assert why in caplog.text
    assert cache.tokens == tuple(prompt[:3])
    caplog.clear()


def forge(path, arrays: bytes, header) -> None:
    """Write a state file of `arrays` (after the magic) and `header`, with a valid hash (as a hostile writer would)."""
    body = json.dumps(header).encode()
    path.write_bytes(
        MAGIC + arrays + body + struct.pack("<Q32s8s", len(body), hashlib.sha256(body).digest(), b"SPRIGEND")
    )


def rewrite_header(path, change) -> None:
    """Rewrite the file's header through `change`."""
    data = path.read_bytes()
    length = struct.unpack("<Q", data[-48:-40])[0]
    forge(path, data[len(MAGIC) : -48 - length], change(json.loads(data[-48 - length : -48])))


def test_truncated_corrupt_and_foreign_files_are_refused(loaded, model_paths, tmp_path, caplog):
    tokens = prompt_tokens(40)
    states, identity = saved_cache(loaded, tokens[:30], tmp_path)
    path = states.path("c1")
    good = path.read_bytes()

    path.write_bytes(good[: len(good) // 2])
    refused(states, loaded, tokens, identity, caplog, "truncated")
    path.write_bytes(good[:-40])
    refused(states, loaded, tokens, identity, caplog, "truncated")

    damaged = bytearray(good)
    damaged[len(MAGIC) + 40] ^= 0xFF  # inside the first array's compressed bytes
    path.write_bytes(bytes(damaged))
    refused(states, loaded, tokens, identity, caplog, "corrupt")
    damaged = bytearray(good)
    damaged[-60] ^= 0x01  # inside the header
    path.write_bytes(bytes(damaged))
    refused(states, loaded, tokens, identity, caplog, "header is corrupt")

    path.write_bytes(good)
    other = identity_of(model_paths[1], loaded.model)
    refused(states, loaded, tokens, other, caplog, "another model file")
    elsewhere = Identity(identity.fingerprint, "cpu" if identity.backend != "cpu" else "numpy")
    refused(states, loaded, tokens, elsewhere, caplog, f"saved on the {identity.backend} backend")
    refused(states, loaded, prompt_tokens(40, seed=9), identity, caplog, "not this conversation's")
    bigger = loaded.new_cache(2 * N_CTX)  # another context: other shapes
    with caplog.at_level(logging.WARNING, logger="engine.saved_state"):
        assert states.restore("c1", bigger, tokens, identity).tokens == 0
    assert "another context length or KV type" in caplog.text


@pytest.mark.parametrize("backend", ["numpy", "cpu"])
def test_a_state_of_another_kv_type_is_refused_even_at_the_same_size(model_paths, tmp_path, caplog, backend):
    """A float32 cache of N_CTX positions takes the bytes of a float16 one of 2 N_CTX: the
    saved layout names the KV type, so neither is read as the other."""
    tokens = prompt_tokens(40)
    loaded = load_model(model_paths[0], backend=backend, kv_type="f32")
    try:
        states, identity = saved_cache(loaded, tokens[:30], tmp_path)
        loaded.model.set_kv_type("f16")
        other = loaded.new_cache(2 * N_CTX)
        layers = [replace(s, slots=N_CTX, kv_type="f32") for s in loaded.model.layer_states(N_CTX)]
        assert other.memory_bytes() == loaded.backend.state_bytes(loaded.backend.allocate_state(layers))
        with caplog.at_level(logging.WARNING, logger="engine.saved_state"):
            assert states.restore("c1", other, tokens, identity).tokens == 0
        assert "another context length or KV type" in caplog.text
    finally:
        loaded.close()


def test_hostile_files_are_refused_before_anything_is_allocated(loaded, tmp_path, caplog):
    tokens = prompt_tokens(40)
    states, identity = saved_cache(loaded, tokens[:30], tmp_path)
    path, good = states.path("c1"), states.path("c1").read_bytes()

    def huge(header):
        header["arrays"][0]["shape"] = [1 << 40, 1 << 20]
        return header

    rewrite_header(path, huge)
    refused(states, loaded, tokens, identity, caplog, "not this cache's")

    def pickled(header):
        header["arrays"][0]["dtype"] = "|O"
        return header

    path.write_bytes(good)
    rewrite_header(path, pickled)
    refused(states, loaded, tokens, identity, caplog, "not this cache's")

    def outside(header):
        header["arrays"][0]["chunks"][0][1] = 1 << 50
        return header

    path.write_bytes(good)
    rewrite_header(path, outside)
    refused(states, loaded, tokens, identity, caplog, "outside the file")

    path.write_bytes(good)
    rewrite_header(path, lambda header: {**header, "tokens": ["x"]})
    refused(states, loaded, tokens, identity, caplog, "token ids are malformed")

    deep = b"[" * 100_000 + b"]" * 100_000
    path.write_bytes(MAGIC + deep + struct.pack("<Q32s8s", len(deep), hashlib.sha256(deep).digest(), b"SPRIGEND"))
    refused(states, loaded, tokens, identity, caplog, "not JSON")

    path.write_bytes(MAGIC + struct.pack("<Q32s8s", 1 << 62, bytes(32), b"SPRIGEND"))
    refused(states, loaded, tokens, identity, caplog, "header claims")

    with open(path, "wb") as f:  # a pickle under the name
        np.save(f, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    refused(states, loaded, tokens, identity, caplog, "not a saved state")


@pytest.mark.parametrize("extra", [100, -1])
def test_an_array_longer_or_shorter_than_its_shape_is_refused_and_the_cache_emptied(loaded, tmp_path, caplog, extra):
    """A file whose hashes hold (written so) but whose pieces hold more (or less) than the array's size."""
    tokens = prompt_tokens(40)
    states, identity = saved_cache(loaded, tokens[:30], tmp_path)
    path = states.path("c1")
    header = read_header(path)
    step, blobs = header["chunk_bytes"], []
    for entry in header["arrays"]:  # every piece: a bitmap of every block kept, then its size and more or less
        nbytes = int(np.prod(entry["shape"])) * np.dtype(entry["dtype"]).itemsize
        for k, chunk in enumerate(entry["chunks"]):
            size = min(step, nbytes - k * step)
            blob = b"\xff" * -(-size // 4096 // 8) + b"\x01" * (size + extra)
            chunk[:] = [len(MAGIC) + sum(map(len, blobs)), len(blob), hashlib.sha256(blob).hexdigest()]
            blobs.append(blob)
    forge(path, b"".join(blobs), header)
    cache = loaded.new_cache(N_CTX)
    cache.feed(loaded.model, tokens[:3])
    with caplog.at_level(logging.WARNING, logger="engine.saved_state"):
        assert states.restore("c1", cache, tokens, identity).tokens == 0
    assert f"{'more' if extra > 0 else 'less'} data than its shape" in caplog.text
    assert cache.n_used == 0  # perhaps partly written: emptied, so the text is read again, as a fresh cache would
    assert np.array_equal(cache.feed(loaded.model, tokens), loaded.new_cache(N_CTX).feed(loaded.model, tokens))


def test_a_session_answers_the_same_from_a_restored_or_refused_state(loaded, tmp_path, caplog):
    states, identity = SavedStates(tmp_path / "states"), identity_of(loaded.path, loaded.model)
    first = ChatSession(loaded, n_ctx=N_CTX, params=GREEDY, max_tokens=6)
    first.saved = ConversationState(states, "c1", identity)
    "".join(e.text for e in first.send("hello there"))
    assert first.save_state() and not first.save_state()  # the second: nothing new to save
    history = list(first.messages)

    def answer(saved, session=None):
        """The text and prefill of the answer to "and then?", and the refusals said before it."""
        if session is None:
            session = ChatSession(loaded, n_ctx=N_CTX, params=GREEDY, max_tokens=6)
            session.saved, session.messages = saved, list(history)
        events = list(session.send("and then?"))
        refusals = [e.state_refused for e in events if e.state_refused is not None]
        return "".join(e.text for e in events), events[-1].metrics.prefill_tokens, refusals

    reread_text, reread_prefill, _ = answer(None)
    restored_text, restored_prefill, refusals = answer(ConversationState(states, "c1", identity))
    assert restored_text == reread_text and refusals == []
    assert restored_prefill < reread_prefill  # only the new turn was read

    damaged = bytearray(states.path("c1").read_bytes())
    damaged[len(MAGIC) + 10] ^= 0xFF
    states.path("c1").write_bytes(bytes(damaged))
    with caplog.at_level(logging.WARNING, logger="engine.saved_state"):
        text, prefill, refusals = answer(ConversationState(states, "c1", identity))
    assert (text, prefill) == (reread_text, reread_prefill) and "corrupt" in caplog.text
    assert refusals == ["an array is corrupt"]  # said to the session's user, once, before the answer
    damaged[-60] ^= 0x01  # the header too: any reading of the file would say so
    states.path("c1").write_bytes(bytes(damaged))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="engine.saved_state"):
        list(first.send("and then?"))  # the session that saved it holds it all: the file is not read
    assert not caplog.text


def test_a_refused_file_is_not_read_again_until_a_save_replaces_it(loaded, tmp_path, caplog):
    states, identity = SavedStates(tmp_path / "states"), identity_of(loaded.path, loaded.model)
    tokens = prompt_tokens(40)
    states.path("c1").parent.mkdir(parents=True)
    states.path("c1").write_bytes(b"SPRIGKV\x01" + bytes(100))  # the first format's magic
    saved = ConversationState(states, "c1", identity)
    cache = loaded.new_cache(N_CTX)
    with caplog.at_level(logging.WARNING, logger="engine.saved_state"):
        assert saved.restore(cache, tokens[:20]).refused == "it was saved by an earlier version of Sprig"
        caplog.clear()
        cache.feed(loaded.model, tokens[:19])
        assert saved.restore(cache, tokens[:30]).refused is None  # not read again
        assert not caplog.text
        assert saved.save(cache) and read_header(states.path("c1"))["tokens"] == tokens[:19]
        assert saved.restore(loaded.new_cache(N_CTX), tokens[:30]).tokens == 19  # the new file serves


# -- the cap --------------------------------------------------------------------------


def test_the_cap_drops_the_least_recently_used(loaded, tmp_path):
    tokens = prompt_tokens(40)
    states, identity = SavedStates(tmp_path / "states"), identity_of(loaded.path, loaded.model)
    cache = loaded.new_cache(N_CTX)
    cache.feed(loaded.model, tokens)
    for i, key in enumerate(("a", "b", "c")):
        states.save(key, cache, identity)
        os.utime(states.path(key), ns=(1_000_000_000 * (i + 1),) * 2)  # saved a, then b, then c
    size = states.path("a").stat().st_size
    assert states.restore("a", loaded.new_cache(N_CTX), [*tokens, 5], identity).tokens == 40  # a: used last
    states.cap_bytes = 3 * size + size // 2
    states.save("d", cache, identity)
    assert [states.path(k).exists() for k in "abcd"] == [True, False, True, True]
    (states.folder / "tmp123.part").write_bytes(b"half a file")  # a save cut short
    states.cap_bytes = size // 2  # smaller than any one file: nothing is kept
    states.save("e", cache, identity)
    assert not any(states.path(k).exists() for k in "abcde")
    assert not list(states.folder.iterdir())


def test_fingerprints_tell_model_files_apart(model_paths, tmp_path):
    a, b = model_paths
    assert model_fingerprint(a) == model_fingerprint(a) != model_fingerprint(b)
    copy = tmp_path / "copy.gguf"
    copy.write_bytes(a.read_bytes())
    assert model_fingerprint(copy) == model_fingerprint(a)  # the same bytes, wherever they lie
