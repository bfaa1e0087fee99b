"""Pieces behind the server's defences, each on its own (milliseconds): the byte bound on token
counts, encodes of long texts that leave Python's lock free, and `cache_salt` in the prefix-cache
hashes (scheduler level: equal prompts share blocks only under equal salts)."""

from __future__ import annotations

import random
import threading
import time

import pytest
from tiny_models import train_tokenizer
from tokenizers import Tokenizer as Backend
from tokenizers import models, normalizers, pre_tokenizers

from inferd.engine.scheduling.kv_cache import KVCacheManager
from inferd.engine.scheduling.request import Request, Sequence
from inferd.engine.scheduling.scheduler import Scheduler
from inferd.engine.scheduling.step import ModelRunnerOutput
from inferd.outputs import RequestMetrics
from inferd.sampling_params import SamplingParams
from inferd.tokenizer import Tokenizer
from inferd.tokenizer.byte_bound import max_bytes_per_token
from inferd.tokenizer.text_guard import UNLOCKED_ABOVE_CHARS


@pytest.fixture(scope="module")
def byte_level(tmp_path_factory) -> Tokenizer:
    folder = tmp_path_factory.mktemp("tok")
    train_tokenizer(folder)
    return Tokenizer.from_hf_dir(folder)


def test_no_text_needs_fewer_tokens_than_its_bytes_allow(byte_level):
    bound = max_bytes_per_token(byte_level.backend)
    assert bound is not None and bound >= 4
    rng = random.Random(0)
    alphabet = "the quick brown fox é ü 😀 日本 \n\t  ab" + "".join(map(chr, range(32, 127)))
    for _ in range(200):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 300)))
        tokens = byte_level.encode(text, add_special_tokens=False)
        assert len(tokens) * bound >= len(text.encode()), text


def test_pipelines_that_drop_text_give_no_bound():
    drops_spaces = Backend(models.BPE(unk_token="[UNK]", fuse_unk=False))
    drops_spaces.pre_tokenizer = pre_tokenizers.Whitespace()
    assert max_bytes_per_token(drops_spaces) is None
    fuses_unknowns = Backend(models.BPE(unk_token="[UNK]", fuse_unk=True))
    assert max_bytes_per_token(fuses_unknowns) is None
    shrinks = Backend(models.BPE(byte_fallback=True))
    shrinks.normalizer = normalizers.NFKC()  # "ﬃ" → "ffi", "Ａ" (3 bytes) → "A" (1)
    assert max_bytes_per_token(shrinks) is None
    assert max_bytes_per_token(Backend(models.WordPiece(unk_token="[UNK]"))) is None


def test_a_long_encode_lets_other_threads_run(byte_level):
    text = "alpha beta gamma delta " * 50_000  # 1.2 MB: a fraction of a second of encoding
    assert len(text) > UNLOCKED_ABOVE_CHARS
    ticks, done = [0], threading.Event()

    def count() -> None:
        while not done.is_set():
            ticks[0] += 1
            time.sleep(0.001)

    counter = threading.Thread(target=count)
    counter.start()
    try:
        started = time.monotonic()
        ids = byte_level.encode(text)
        seconds = time.monotonic() - started
    finally:
        done.set()
        counter.join()
    assert ids == byte_level.backend.encode(text).ids  # the same tokens as a plain encode
    # Holding the lock, the encode would let the counter tick once or twice at most.
    assert ticks[0] >= max(5, seconds * 50), (ticks[0], seconds)


BLOCK = 4


def _request(prompt: list[int], salt: str | None) -> Request:
    params = SamplingParams(max_tokens=1, ignore_eos=True)
    req = Request(f"r{random.random()}", list(prompt), params, RequestMetrics(0.0), 1,
                  forked=True, cache_salt=salt)  # fmt: skip
    req.sequences = [Sequence(random.randrange(1 << 30), req, 0, list(prompt), len(prompt))]
    return req


def _cached_tokens(sched: Scheduler, prompt: list[int], salt: str | None) -> int:
    req = _request(prompt, salt)
    sched.add_request(req)
    while sched.has_unfinished_requests():
        out = sched.schedule()
        sched.update_from_output(out, ModelRunnerOutput([[7] for _ in out.sample_ids]))
    return req.metrics.num_cached_tokens


def test_equal_prompts_share_cached_blocks_only_under_equal_salts():
    kv = KVCacheManager([None], [64], BLOCK, True)
    sched = Scheduler(kv, 4, 64, 128, (), b"root")
    prompt = list(range(100, 113))  # 3 full blocks
    assert _cached_tokens(sched, prompt, "tenant-a") == 0
    assert _cached_tokens(sched, prompt, "tenant-a") == 12
    assert _cached_tokens(sched, prompt, "tenant-b") == 0
    assert _cached_tokens(sched, prompt, None) == 0
    assert _cached_tokens(sched, prompt, None) == 12
