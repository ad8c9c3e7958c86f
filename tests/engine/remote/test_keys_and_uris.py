"""API keys in the keyring (an in-memory one here), and model URIs."""

from pathlib import Path

import pytest

from engine.keyring_store import SERVICE
from engine.model_uri import local_uri, parse_model_uri, remote_uri
from engine.remote import keys


def test_a_key_is_kept_in_the_keyring_per_server_and_forgotten(memory_keyring):
    keys.save_api_key("http://a/v1", " sk-1 ")
    keys.save_api_key("http://b/v1", "sk-2")
    assert memory_keyring.saved == {
        (SERVICE, "server:http://a/v1"): "sk-1",
        (SERVICE, "server:http://b/v1"): "sk-2",
    }
    assert keys.api_key("http://a/v1") == "sk-1"
    keys.save_api_key("http://a/v1", "")
    assert keys.api_key("http://a/v1") is None and keys.api_key("http://b/v1") == "sk-2"


def test_uris_name_local_files_and_remote_models(tmp_path):
    path = tmp_path / "my model.gguf"
    assert parse_model_uri(local_uri(path)).path == path
    ref = parse_model_uri(remote_uri("https://h:1/v1", "org/name:q4"))
    assert ref.is_remote and (ref.base_url, ref.model_id) == ("https://h:1/v1", "org/name:q4")
    assert not parse_model_uri(Path("/m/x.gguf").as_uri()).is_remote
    for bad in ("/m/x.gguf", "openai+ftp://h/v1#m", "openai+http://h/v1"):
        with pytest.raises(ValueError):
            parse_model_uri(bad)
