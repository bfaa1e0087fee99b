"""Pooling without a model: PoolingParams' checks and resolution against a model's PoolerConfig,
--pooler-config, what a checkpoint's files say (sentence-transformers modules, GGUF metadata),
and the device side's incremental pooling across prefill chunks and preemption."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from inferd.engine.execution.pooler import PoolingState, chunk_part
from inferd.errors import InvalidRequest
from inferd.loader.pooler_config import pooler_config
from inferd.pooling_params import PoolerConfig, PoolingParams, pooler_overrides

PLAIN = PoolerConfig(8)  # a decoder model's defaults: last, normalised, no truncation


@pytest.mark.parametrize(("kwargs", "param"), [
    ({"pooling_type": "max"}, "pooling_type"),
    ({"normalize": 1}, "normalize"),
    ({"dimensions": 0}, "dimensions"),
    ({"dimensions": True}, "dimensions"),
    ({"dimensions": "4"}, "dimensions"),
])  # fmt: skip
def test_bad_pooling_params_name_the_field(kwargs, param):
    with pytest.raises(InvalidRequest) as info:
        PoolingParams(**kwargs)
    assert info.value.param == param


def test_resolve_fills_the_models_defaults_and_keeps_the_requests():
    assert PoolingParams().resolve(PLAIN) == PoolingParams("last", True, None)
    model = PoolerConfig(8, "mean", normalize=False)
    assert PoolingParams(pooling_type="CLS").resolve(model) == PoolingParams("cls", False, None)
    assert PoolingParams(normalize=True).resolve(model).normalize is True


def test_dimensions_only_where_the_model_allows_them():
    with pytest.raises(InvalidRequest, match="not trained for shorter embeddings") as info:
        PoolingParams(dimensions=4).resolve(PLAIN)
    assert info.value.param == "dimensions"
    assert PoolingParams(dimensions=8).resolve(PLAIN).dimensions == 8  # the full size: no cut
    listed = PoolerConfig(8, matryoshka_dimensions=(2, 4))
    assert PoolingParams(dimensions=4).resolve(listed).dimensions == 4
    with pytest.raises(InvalidRequest, match="allows 2, 4 or 8"):
        PoolingParams(dimensions=3).resolve(listed)
    free = PoolerConfig(8, is_matryoshka=True)
    assert PoolingParams(dimensions=3).resolve(free).dimensions == 3
    with pytest.raises(InvalidRequest, match="have 8 values"):
        PoolingParams(dimensions=9).resolve(free)


def test_an_engine_or_model_without_embeddings_refuses():
    with pytest.raises(InvalidRequest, match="does not compute embeddings"):
        PoolingParams().resolve(None)
    with pytest.raises(InvalidRequest, match="Dense"):
        PoolingParams().resolve(PoolerConfig(8, unsupported="a Dense module"))


def test_pooler_overrides_are_checked():
    assert pooler_overrides('{"pooling_type": "MEAN", "matryoshka_dimensions": [4]}') == {
        "pooling_type": "mean", "matryoshka_dimensions": (4,)}  # fmt: skip
    assert pooler_overrides(None) == {}
    for bad, words in [("{", "not JSON"), ("[1]", "JSON object"), ('{"x": 1}', "unknown key"),
                       ('{"normalize": 1}', "true or false"),
                       ('{"matryoshka_dimensions": [0]}', "positive integers"),
                       ('{"pooling_type": "max"}', "must be one of")]:  # fmt: skip
        with pytest.raises(ValueError, match=words):
            pooler_overrides(bad)


def _hf(folder: Path, modules: list | None, pooling: dict | None = None, **config):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    if modules is not None:
        (folder / "modules.json").write_text(json.dumps(modules))
    if pooling is not None:
        (folder / "1_Pooling").mkdir()
        (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    return SimpleNamespace(format="hf", path=folder, gguf=None,
                           config=SimpleNamespace(hidden_size=16))  # fmt: skip


ST = "sentence_transformers.models."
TRANSFORMER = {"idx": 0, "name": "0", "path": "", "type": ST + "Transformer"}
POOLING = {"idx": 1, "name": "1", "path": "1_Pooling", "type": ST + "Pooling"}
NORMALIZE = {"idx": 2, "name": "2", "path": "2_Normalize", "type": ST + "Normalize"}


def test_sentence_transformers_modules_set_the_defaults(tmp_path):
    mean = {"pooling_mode_mean_tokens": True, "pooling_mode_cls_token": False}
    cfg = pooler_config(_hf(tmp_path / "a", [TRANSFORMER, POOLING, NORMALIZE], mean))
    assert (cfg.pooling_type, cfg.normalize, cfg.unsupported) == ("mean", True, None)
    assert cfg.source == "a/1_Pooling/config.json"
    last = {"pooling_mode_lasttoken": True}
    cfg = pooler_config(_hf(tmp_path / "b", [TRANSFORMER, POOLING], last))
    assert (cfg.pooling_type, cfg.normalize) == ("last", False)  # no Normalize module
    dense = {"idx": 2, "name": "2", "path": "2_Dense", "type": ST + "Dense"}
    cfg = pooler_config(_hf(tmp_path / "c", [TRANSFORMER, POOLING, dense], last))
    assert "Dense" in cfg.unsupported
    cfg = pooler_config(
        _hf(tmp_path / "d", [TRANSFORMER, POOLING], {"pooling_mode_max_tokens": True})
    )
    assert "pooling_mode_max_tokens" in cfg.unsupported


def test_plain_folders_matryoshka_keys_and_overrides(tmp_path):
    cfg = pooler_config(_hf(tmp_path / "a", None))
    assert cfg == PoolerConfig(16)  # a decoder model's defaults
    cfg = pooler_config(_hf(tmp_path / "b", None, matryoshka_dimensions=[4, 8, 64]))
    assert cfg.matryoshka_dimensions == (4, 8)  # sizes past the model's own are dropped
    cfg = pooler_config(_hf(tmp_path / "c", None), {"pooling_type": "cls", "is_matryoshka": True})
    assert (cfg.pooling_type, cfg.is_matryoshka, cfg.source) == ("cls", True, "--pooler-config")
    with pytest.raises(ValueError, match="exceed the model's embedding size 16"):
        pooler_config(_hf(tmp_path / "d", None), {"matryoshka_dimensions": [32]})


def test_gguf_pooling_type_metadata():
    def gguf(kind):
        meta = {} if kind is None else {"bert.pooling_type": kind}
        file = SimpleNamespace(architecture="bert", get=meta.get)
        config = SimpleNamespace(hidden_size=4)
        return SimpleNamespace(format="gguf", path=Path("m.gguf"), config=config, gguf=file)

    assert pooler_config(gguf(None)).pooling_type == "last"
    assert pooler_config(gguf(1)).pooling_type == "mean"
    assert pooler_config(gguf(2)).pooling_type == "cls"
    assert pooler_config(gguf(4)).unsupported is not None  # llama.cpp's rank pooling


def test_chunk_parts_and_incremental_pooling():
    hidden = torch.arange(12, dtype=torch.float32).reshape(6, 2)  # 6 positions, 2 values
    chunks = [(0, hidden[:4]), (4, hidden[4:])]
    for kind, expected in [("last", hidden[-1]), ("mean", hidden.mean(0)), ("cls", hidden[0])]:
        state = PoolingState(PoolingParams(kind, normalize=False))
        for start, chunk in chunks:
            state.add(chunk_part(chunk, kind, start), start)
        assert state.finish(6) == expected.tolist()


def test_preemption_restarts_the_pooling():
    """A preempted request recomputes from position 0: what it pooled before is dropped."""
    state = PoolingState(PoolingParams("mean", normalize=False))
    state.add(torch.tensor([100.0, 100.0]), 0)  # a first chunk, then preempted
    state.add(torch.tensor([2.0, 4.0]), 0)  # recomputed: the whole prompt of 2 in one chunk
    assert state.finish(2) == [1.0, 2.0]


def test_dimensions_cut_before_normalising():
    state = PoolingState(PoolingParams("last", normalize=True, dimensions=2))
    state.add(torch.tensor([3.0, 4.0, 100.0]), 0)
    assert state.finish(1) == pytest.approx([0.6, 0.8])


def test_the_start_up_line_says_how_and_why():
    assert PLAIN.describe() == "last pooling, normalised (the default for decoder models)"
    listed = PoolerConfig(8, "mean", False, matryoshka_dimensions=(2, 4), source="--pooler-config")
    assert listed.describe() == "mean pooling, not normalised, dimensions 2, 4 allowed " \
        "(--pooler-config)"  # fmt: skip
    assert PoolerConfig(8, unsupported="a Dense module").describe() == "refused: a Dense module"
