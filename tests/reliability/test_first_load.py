"""A first load of a GGUF file in bounded memory (loader/gguf_cache.py): the blocks are packed a
layer at a time and written to the weight cache as they go, large matrices a range of rows at a
time; a cache that cannot take the entry (its size, a disk that fills up meanwhile) costs only
start-up time, said once; a model larger than the memory available is refused before anything
is allocated. Tiny random GGUF files (tests/tiny_gguf.py)."""

from __future__ import annotations

import logging

import pytest
import torch
from tiny_gguf import write_tiny_gguf

from inferd.errors import ModelLoadError
from inferd.layers import gguf_blocks
from inferd.layers.gguf_blocks import BlockValues, BlockWeight, packed
from inferd.loader import model_loader, weight_cache
from inferd.loader.checkpoint import open_checkpoint
from inferd.loader.model_loader import load_model


def random_values(rows: int, cols: int, offsets: bool, seed: int = 0) -> BlockValues:
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (rows, cols), dtype=torch.int8, generator=gen)
    scale = torch.rand(rows, cols // 32, generator=gen)
    offset = torch.randn(rows, cols // 32, generator=gen) if offsets else None
    return BlockValues(q, scale, offset, (0, 15), False)


@pytest.mark.parametrize("offsets", [False, True])
@pytest.mark.parametrize("padded", [None, 100])
def test_a_matrix_packed_in_ranges_of_rows_is_the_same_as_at_once(monkeypatch, offsets, padded):
    values = random_values(83, 64, offsets)
    ranges = []

    def load(first, n):
        ranges.append((first, n))
        return values._replace(q=values.q[first : first + n], scale=values.scale[first : first + n],
                               offset=None if values.offset is None
                               else values.offset[first : first + n])  # fmt: skip

    whole = packed(load, 83, 64, padded)
    assert ranges == [(0, 83)]  # small: one range
    monkeypatch.setattr(gguf_blocks, "CHUNK_WEIGHTS", 64 * 16)
    monkeypatch.setattr(gguf_blocks, "CHUNK_ROWS", 32)
    ranges.clear()
    chunked = packed(load, 83, 64, padded)
    assert ranges == [(0, 32), (32, 32), (64, 19)]
    assert chunked.shape == whole.shape == (padded or 83, 64)
    assert torch.equal(chunked.dequantized(), whole.dequantized())
    (a,) = chunked.parts
    (b,) = whole.parts
    assert all(torch.equal(a.stored()[0][k], b.stored()[0][k]) for k in b.stored()[0])


def test_ranges_stored_in_different_widths_are_not_joined():
    builder = gguf_blocks._PartBuilder(32)
    builder.add(0, BlockWeight(*random_values(16, 64, False)).parts[0])
    wide = random_values(16, 64, False)._replace(value_range=(-128, 127))
    with pytest.raises(ValueError, match="stored as"):
        builder.add(16, BlockWeight(*wide).parts[0])


def test_a_model_larger_than_the_memory_available_is_refused_before_loading(
        tmp_path, monkeypatch):  # fmt: skip
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, "llama")
    monkeypatch.setattr(model_loader, "available_memory", lambda: 100_000)
    built = []
    monkeypatch.setattr(model_loader, "model_class", lambda arch: built.append(arch))
    with pytest.raises(
        ModelLoadError,
        match=r"tiny.gguf needs about .* GiB for its weights "
        r"\(float32\), and this machine has 0.0 GiB of memory available",
    ):
        load_model(open_checkpoint(path), torch.float32, torch.device("cpu"))
    assert not built  # refused before the model was built


def logits_of(model) -> torch.Tensor:
    from inferd.engine.execution.runner import ModelRunner, SequenceStep

    runner = ModelRunner(model, [64] * len(model.config.kv_groups()), 16, torch.float32,
                         torch.device("cpu"), None)  # fmt: skip
    tables = [list(range(1, 9))] * len(runner.kv_caches)
    step = SequenceStep([5, 17, 300, 42, 7], 0, tables)
    return runner.execute_with_prompt_logits([step])[0].float()


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    monkeypatch.setenv("INFERD_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, "qwen2")
    return path


def load(path, **kwargs):
    return load_model(open_checkpoint(path), torch.float32, torch.device("cpu"), "gguf", **kwargs)


def test_a_cache_too_small_for_the_entry_runs_the_model_from_its_file(tiny, caplog, c_kernels):
    with caplog.at_level(logging.WARNING):
        small = logits_of(load(tiny, weight_cache_size=1000))
    assert "exceed the weight cache's size" in caplog.text and "runs from the file" in caplog.text
    assert not list((tiny.parent / "cache" / "weights").glob("*.safetensors"))
    assert torch.equal(small, logits_of(load(tiny)))  # then cached: the same logits


def test_a_disk_that_fills_up_while_the_entry_is_written_loses_nothing(
        tiny, monkeypatch, caplog, c_kernels):  # fmt: skip
    expected = logits_of(load(tiny, weight_cache_size=0))
    real_write, calls = weight_cache.EntryWriter.write, []

    def write(self, key, tensor):
        calls.append(key)
        if len(calls) > 6:
            raise OSError(28, "No space left on device")
        real_write(self, key, tensor)

    monkeypatch.setattr(weight_cache.EntryWriter, "write", write)
    with caplog.at_level(logging.WARNING):
        model = load(tiny)
    assert caplog.text.count("No space left on device") == 1
    assert torch.equal(logits_of(model), expected)  # layers from the unfinished file and memory
    weights = tiny.parent / "cache" / "weights"
    assert not list(weights.glob("*.safetensors")) and not list(weights.glob("*.part"))


def test_a_cache_folder_that_cannot_be_written_runs_the_model_from_its_file(
        tmp_path, monkeypatch, caplog, c_kernels):  # fmt: skip
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folder would be")
    monkeypatch.setenv("INFERD_CACHE", str(blocker / "cache"))
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, "llama")
    with caplog.at_level(logging.WARNING):
        model = load(path)
    assert caplog.text.count("not caching tiny.gguf's packed blocks") == 1
    assert model.cpu_decoder is not None and torch.isfinite(logits_of(model)).all()


def test_a_load_that_fails_halfway_leaves_no_unfinished_entry(tiny, monkeypatch, c_kernels):
    from inferd.layers.block_method import BlockMethod

    real_take, taken = BlockMethod.take_blocks, []

    def take_blocks(self, layer, shard, blocks):
        taken.append(shard)
        if len(taken) > 4:
            raise ValueError("a tensor the model cannot take")
        real_take(self, layer, shard, blocks)

    monkeypatch.setattr(BlockMethod, "take_blocks", take_blocks)
    with pytest.raises(ModelLoadError, match="a tensor the model cannot take"):
        load(tiny)
    weights = tiny.parent / "cache" / "weights"
    assert not list(weights.glob("*.part")) and not list(weights.glob("*.safetensors"))
