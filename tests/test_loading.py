"""Model loading: local folders, GGUF conversion cache, clear errors, no network for paths."""

from __future__ import annotations

import json

import pytest

from slmclassify import ModelLoadError, load_model
from slmclassify.loading import SUPPORTED_ARCHITECTURES


def test_local_folder(tiny_model_dir):
    loaded = load_model(str(tiny_model_dir))
    assert loaded.model.config.model_type in SUPPORTED_ARCHITECTURES
    assert not loaded.model.training
    assert loaded.tokenizer.pad_token_id is not None


@pytest.mark.parametrize("source", ["/nonexistent/model", "./missing-folder", "missing.gguf"])
def test_missing_paths_fail_without_network(source):
    with pytest.raises(ModelLoadError, match="not found"):
        load_model(source)


def test_folder_without_config(tmp_path):
    with pytest.raises(ModelLoadError, match="config.json"):
        load_model(str(tmp_path))


def test_unsupported_architecture(tmp_path, llama_dir):
    for f in llama_dir.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    config = json.loads((tmp_path / "config.json").read_text())
    config["model_type"] = "gpt2"
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="not supported"):
        load_model(str(tmp_path))
