"""The step record and the messages of the process boundary are plain data: they round-trip
through the wire format (msgspec msgpack, typed) and pickle (tensor-parallel control messages)
unchanged; a block-table delta turns any table the KV manager can produce into the next one."""

from __future__ import annotations

import pickle
import random

import msgspec
import pytest

from inferd.engine.core.core_output import (
    CoreOutput,
    CoreRequest,
    RequestEvents,
    SampleDelta,
    SampleFinish,
)
from inferd.engine.scheduling.step import (
    NULL_BLOCK,
    BlockUpdate,
    NewSequence,
    ScheduledRow,
    StepRecord,
    TokenLogprobs,
    diff_table,
)
from inferd.engine.transport import ipc
from inferd.engine_client import EngineStats, ModelInfo
from inferd.lora_request import LoRARequest
from inferd.pooling_params import PoolerConfig, PoolingParams
from inferd.profiling.step_timer import StepTimer
from inferd.sampling_params import SamplingParams

PARAMS = SamplingParams(temperature=0.7, top_k=20, seed=3, stop=["\n\n"], logit_bias={5: -1.5},
                        max_tokens=9, structured_outputs={"regex": "[a-z]+"})  # fmt: skip
POOLING = PoolingParams(pooling_type="mean", normalize=True, dimensions=64)


def record() -> StepRecord:
    return StepRecord(
        rows=[
            ScheduledRow(
                3, 0, 12, [], [BlockUpdate(0, 0, [4, 5, 6]), None], True, True, fork_seq_ids=[4]
            ),
            ScheduledRow(
                1, 40, 1, [17], [None, BlockUpdate(2, 3, [9])], True, draft_token_ids=[8, 8]
            ),
            ScheduledRow(2, 16, 16, [], None, False, adapter_slot=2),
        ],  # fmt: skip
        new_sequences=[
            NewSequence(3, list(range(12)), PARAMS, 3),
            NewSequence(4, [], PARAMS, 4, fork_of=3),
            NewSequence(2, list(range(32)), SamplingParams(), pooling=POOLING),
        ],  # fmt: skip
        finished_seq_ids=[0],
        blocks_to_clear=[[4, 5, 6], [9]],
        block_copies=[(0, 6, 11)],
        grammar_bitmasks={3: b"\xff\x0f\x00\x01", 4: b"\x01\x00\x00\x80"},
        preempted_seq_ids=[7],
        adapter_loads=[(2, LoRARequest("sql", 5, "/adapters/sql"))],
    )


def test_the_step_record_round_trips_unchanged():
    original = record()
    wire = msgspec.msgpack.encode(original)
    assert msgspec.msgpack.decode(wire, type=StepRecord) == original
    assert pickle.loads(pickle.dumps(original)) == original
    workers = original.for_workers()
    assert workers.grammar_bitmasks == {} and workers.rows == original.rows
    assert workers.adapter_loads == original.adapter_loads  # every rank loads the adapter
    assert original.sample_ids == [3, 4, 1] and original.num_tokens == 12 + 3 + 16


def test_every_message_of_the_process_boundary_round_trips():
    timer = StepTimer()
    stats = EngineStats(1, 2, 0.5, 3, 4, 5, 6, 7, 8, timer.snapshot(), 1, 2, 1, (1, 0))
    out = CoreOutput("r-0", [SampleDelta(0, [5, 6], [TokenLogprobs([5, 1], [-0.1, -2.5], [1, 2])],
                                          "stop", 6)],
                     12.5, RequestEvents(1.0, 2.0, 16, (3.0,)),
                     [TokenLogprobs([9], [-1.0], [4])], True, None)  # fmt: skip
    embedded = CoreOutput("r-2", [SampleDelta(0, finish_reason="stop")], 13.0, None,
                          finished=True, embedding=[0.25, -0.5, 1.0])  # fmt: skip
    pooler = PoolerConfig(640, "mean", True, False, (64, 128), "modules.json")
    info = ModelInfo("m", "M", 1024, 262144, "fp_x", pooler)
    messages = [
        ipc.Add(CoreRequest("r-0", [1, 2, 3], PARAMS, 9, 0.25, "salt")),
        ipc.Add(CoreRequest("r-2", [1, 2, 3], SamplingParams(), 0, 0.5, None, POOLING)),
        ipc.Add(CoreRequest("r-1", [1], PARAMS, 9, 0.25, lora_request=LoRARequest("a", 1, "/a"))),
        ipc.Abort(["r-0", "r-1"]),
        ipc.Finish([SampleFinish("r-0", 1)]),
        ipc.Call(7, "start_profile", ["/tmp/x"]),
        ipc.Stop(),
    ]
    for m in messages:
        assert ipc.decode_to_core(ipc.encode(m)) == m
    back = [
        ipc.Ready(info, 1024, 64, 1024, b"\x00root", 16, 900, 1234),
        ipc.StartFailed("ModelLoadError", "no such file"),
        ipc.Outputs(
            [out, embedded], [ipc.AddAck("r-1", "InvalidRequest", "prompt", "empty")], stats, 61.5
        ),
        ipc.CallResult(7, {"trace": "a", "ops_table": "b", "steps": 3, "table": "c"}),
    ]
    for m in back:
        assert ipc.decode_from_core(ipc.encode(m)) == m


def test_errors_cross_as_the_type_they_are():
    from inferd.errors import ContextTooLong, InvalidRequest
    from inferd.structured_params import InvalidGrammarError

    for error in (ContextTooLong("max_tokens", "too long"),
                  InvalidGrammarError("structured_outputs.regex", "bad regex")):  # fmt: skip
        again = ipc.rebuild_error(*ipc.describe_error(error))
        assert isinstance(again, InvalidRequest) and (again.param, str(again)) == (
            error.param, str(error))  # fmt: skip
    assert type(ipc.rebuild_error(*ipc.describe_error(KeyError("x")))) is RuntimeError


def _changes(table: list[int], rng: random.Random) -> list[int]:
    """One change the KV manager makes: blocks appended, leading blocks released to a window,
    a tail of rejected-draft blocks given back, or a whole new table."""
    kind = rng.choice(["append", "window", "tail", "new"])
    if kind == "append":
        return table + [rng.randrange(1, 99) for _ in range(rng.randrange(1, 3))]
    if kind == "window" and table:
        cut = rng.randrange(len(table) + 1)
        return [NULL_BLOCK] * cut + table[cut:]
    if kind == "tail" and table:
        return table[: rng.randrange(len(table))]
    return [NULL_BLOCK] * rng.randrange(3) + [rng.randrange(1, 99) for _ in range(rng.randrange(5))]


@pytest.mark.parametrize("seed", range(5))
def test_block_updates_rebuild_every_table(seed):
    rng = random.Random(seed)
    device, table = [], []
    for _ in range(300):
        table = _changes(table, rng)
        update = diff_table(device, table)
        if update is None:
            assert device == table
        else:
            device = update.apply(device)
        assert device == table
