"""What crosses a handle survives pickling with its meaning (typed errors with their `param`,
prompts sent once, metrics moved onto the ingress's clock), and the ingress's board of replica
reports: health, summed stats that never go back, per-replica series (no cluster)."""

from __future__ import annotations

import dataclasses
import pickle

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from inferd.engine_client import EngineStats
from inferd.errors import ContextTooLong, EngineDeadError, InvalidRequest, Overloaded, RequestFailed
from inferd.outputs import (
    CompletionOutput,
    EmbeddingOutput,
    EmbeddingRequestOutput,
    RequestMetrics,
    RequestOutput,
)
from inferd.ray_serve.replica_board import ReplicaBoard
from inferd.ray_serve.wire import EngineCall, ErrorData, PromptMemo, ReplicaReport, shifted
from inferd.sampling_params import SamplingParams
from inferd.structured_params import InvalidGrammarError


def _trip(value):
    return pickle.loads(pickle.dumps(value))


@pytest.mark.parametrize(
    "error",
    [
        InvalidRequest("temperature", "temperature must be >= 0"),
        ContextTooLong("max_tokens", "too long"),
        Overloaded("queue full"),
        EngineDeadError("the engine loop died"),
        RequestFailed("step raised"),
    ],
)
def test_errors_cross_by_kind_with_their_param(error):
    again = _trip(ErrorData.of(error)).error()
    assert type(again) is type(error) and str(again) == str(error)
    assert getattr(again, "param", None) == getattr(error, "param", None)


def test_a_subclass_crosses_as_the_error_the_server_maps():
    error = InvalidGrammarError("response_format: unknown type", "response_format")
    again = _trip(ErrorData.of(error)).error()
    assert type(again) is InvalidRequest and again.param == "response_format"
    assert str(again) == str(error) and again.code == error.code


def test_an_unexpected_error_stays_an_internal_one():
    again = ErrorData.of(KeyError("x")).error()
    assert type(again) is RuntimeError and "KeyError" in str(again)


def _output(n_tokens: int, finished: bool = False) -> RequestOutput:
    metrics = RequestMetrics(arrival_time=100.0, first_scheduled_time=100.5,
                             first_token_time=101.0, last_token_time=101.0 + n_tokens,
                             preemption_times=(100.7,))  # fmt: skip
    return RequestOutput("r-0", "Hello there", [2, 9, 9, 9],
                         [CompletionOutput(0, "x" * n_tokens, list(range(n_tokens)))],
                         finished, prompt_logprobs=[None, {9: None}], metrics=metrics)  # fmt: skip


def test_the_prompt_is_sent_once_and_filled_back_in():
    sender, receiver = PromptMemo(), PromptMemo()
    sent = [_trip(sender.thin(_output(n))) for n in (1, 2, 3)]
    assert sent[0].prompt_token_ids == [2, 9, 9, 9]
    assert all(s.prompt_token_ids != [2, 9, 9, 9] for s in sent[1:])  # thinned on the wire
    for n, item in enumerate(sent, start=1):
        out = receiver.fill(item)
        assert out.prompt == "Hello there" and out.prompt_token_ids == [2, 9, 9, 9]
        assert out.prompt_logprobs == [None, {9: None}] and len(out.outputs[0].token_ids) == n


def test_an_embedding_output_crosses_whole():
    metrics = RequestMetrics(arrival_time=100.0, finished_time=100.5)
    out = EmbeddingRequestOutput("e-0", EmbeddingOutput([0.5, -0.5]), [2, 9], metrics=metrics)
    back = PromptMemo().fill(_trip(PromptMemo().thin(out)))
    assert back == out
    assert shifted(back, offset=-90.0, arrival=9.8).metrics.finished_time == pytest.approx(10.5)


def test_metrics_move_onto_the_ingress_clock():
    out = shifted(_output(2), offset=-90.0, arrival=9.8)
    m = out.metrics
    assert m.arrival_time == 9.8 and m.first_token_time == pytest.approx(11.0)
    assert m.last_token_time == pytest.approx(13.0) and m.preemption_times == pytest.approx((10.7,))
    assert m.finished_time is None


def test_an_engine_call_names_its_prompt_for_both_routers():
    params = SamplingParams(max_tokens=2)
    text = EngineCall("a", {"prompt": "hi there", "prompt_token_ids": [5, 6]}, params, 0.0)
    ids = EngineCall("b", {"prompt": None, "prompt_token_ids": [5, 6], "cache_salt": "s"},
                     params, 0.0)  # fmt: skip
    assert text.prompt == "hi there" and text.token_ids == [5, 6] and text.cache_salt is None
    assert ids.token_ids == [5, 6] and ids.cache_salt == "s"
    assert len(ids.prompt) == 2 and ids.prompt != EngineCall("c", [5, 7], params, 0.0).prompt


def _stats(running: int, prompt_tokens: int, hits: int = 0, kv: float = 0.0) -> EngineStats:
    return EngineStats(running, 0, kv, 0, prompt_tokens, hits, prompt_tokens, 0, 1)


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_board_health_follows_the_replicas():
    clock = _Clock()
    board = ReplicaBoard("m", stale_after_s=5.0, clock=clock)
    assert "no engine replica is serving" in board.health()
    board.report(ReplicaReport("a", "n1", None, _stats(1, 10)))
    board.report(ReplicaReport("b", "n2", "the engine loop died", _stats(0, 5)))
    assert board.health() is None  # one healthy replica serves
    board.lost("a", "its actor died")
    assert "replica b: the engine loop died" in board.health()
    clock.now = 6.0  # b stopped reporting
    assert "replica a: its actor died" in board.health()
    board.report(ReplicaReport("c", "n1", None, _stats(0, 0)))
    assert board.health() is None


def test_board_stats_sum_replicas_and_keep_the_counts_of_departed_ones():
    clock = _Clock()
    board = ReplicaBoard("m", clock=clock)
    board.report(ReplicaReport("a", "n1", None, _stats(2, 100, hits=40, kv=0.5)))
    board.report(ReplicaReport("b", "n2", None, _stats(1, 50, kv=0.1)))
    total = board.stats()
    assert (total.num_running, total.prompt_tokens, total.prefix_cache_hits) == (3, 150, 40)
    assert total.kv_cache_usage == pytest.approx(0.3)
    board.lost("a", "its actor died")
    after = board.stats()
    assert after.prompt_tokens == 150 and after.num_running == 1  # counters stay, gauges go
    board.report(ReplicaReport("b", "n2", None, _stats(0, 60), stopping=True))
    assert board.stats().prompt_tokens == 160 and board.health() is not None


def test_board_stats_merge_the_replicas_adapters():
    board = ReplicaBoard("m", clock=_Clock())
    a = dataclasses.replace(_stats(1, 10), lora_resident=("x", "y"), lora_requests={"x": 2, "y": 1})
    b = dataclasses.replace(_stats(1, 10), lora_resident=("y",), lora_requests={"y": 4})
    board.report(ReplicaReport("a", "n1", None, a))
    board.report(ReplicaReport("b", "n2", None, b))
    total = board.stats()
    assert total.lora_resident == ("x", "y") and total.lora_requests == {"x": 2, "y": 5}
    board.lost("a", "its actor died")
    after = board.stats()  # a departed replica's requests still count; its adapters are gone
    assert after.lora_resident == ("y",) and after.lora_requests == {"x": 2, "y": 5}


def test_board_exports_each_replica_and_the_routing_decisions():
    board = ReplicaBoard("m")
    board.report(ReplicaReport("a", "node-1", None, _stats(2, 100, hits=40)))
    board.report(ReplicaReport("b", "node-2", "stalled", _stats(0, 7)))
    board.count_decision("prefix_hit")
    board.count_decision("prefix_hit")
    board.count_decision(None)  # a router that does not annotate
    registry = CollectorRegistry()
    registry.register(board)
    text = generate_latest(registry).decode()
    assert 'inferd:engine_replicas{model_name="m",state="healthy"} 1.0' in text
    assert 'inferd:replica_up{model_name="m",node="node-2",replica="b"} 0.0' in text
    assert ('inferd:replica_prefix_cache_hits_total{model_name="m",node="node-1",replica="a"} '
            "40.0") in text  # fmt: skip
    assert 'inferd:router_decisions_total{decision="prefix_hit",model_name="m"} 2.0' in text
