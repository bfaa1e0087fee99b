"""Short model names: resolved where a model is opened, with the settings a name brings."""

from __future__ import annotations

import json

import pytest

from inferd.config import EngineConfig
from inferd.errors import ModelLoadError
from inferd.loader import catalog
from inferd.loader.checkpoint import open_checkpoint


@pytest.fixture(autouse=True)
def _empty_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("INFERD_CACHE", str(tmp_path / "cache"))


def test_a_name_not_pulled_says_how_to_pull_it():
    assert not catalog.is_present(catalog.SMOLLM2_INSTRUCT)
    assert catalog.chat_model() is None
    with pytest.raises(ModelLoadError, match="inferd pull smollm2-135m-instruct"):
        open_checkpoint("smollm2-135m-instruct")


def test_an_unknown_name_lists_the_short_names():
    with pytest.raises(ModelLoadError, match="does not exist.*smollm2-135m-instruct"):
        open_checkpoint("no-such-model")


def test_a_file_of_the_same_name_wins(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "smollm2-135m-instruct").mkdir()
    with pytest.raises(ModelLoadError, match="not a model"):  # the folder was opened
        open_checkpoint("smollm2-135m-instruct")
    config = EngineConfig(model="smollm2-135m-instruct")
    assert catalog.with_engine_defaults(config) == config  # a path brings no settings


def test_a_stamp_that_does_not_match_the_file_is_not_present():
    model = catalog.SMOLLM2_INSTRUCT
    model.path.parent.mkdir(parents=True)
    model.path.write_bytes(b"GGUF" + bytes(10))
    assert not catalog.is_present(model)  # no stamp: an interrupted or foreign file
    mtime = model.path.stat().st_mtime_ns
    model.stamp_path.write_text(json.dumps({"file": {"size": 99, "mtime_ns": mtime}}))
    assert not catalog.is_present(model)  # the file changed since it was checked
    model.stamp_path.write_text(json.dumps({"file": {"size": 14, "mtime_ns": mtime}}))
    assert catalog.is_present(model) and catalog.chat_model() == model


def test_engine_defaults_apply_only_where_the_user_left_the_default():
    name = "smollm2-135m-instruct"
    defaulted = catalog.with_engine_defaults(EngineConfig(model=name))
    assert defaulted.dtype == "float32"
    # the start-up line then names the entry, not a --dtype nobody gave
    assert dict(defaulted.defaults_from)["dtype"].startswith(f"the default of {name}")
    chosen = EngineConfig(model=name, dtype="bfloat16")
    assert catalog.with_engine_defaults(chosen).dtype == "bfloat16"
    assert catalog.with_engine_defaults(chosen).defaults_from == ()
    assert catalog.with_engine_defaults(EngineConfig()).dtype == "auto"  # the embedded model
    assert catalog.lookup(" SmolLM2-135M-Instruct ") is catalog.SMOLLM2_INSTRUCT
