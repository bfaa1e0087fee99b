"""Admission control (inferd/server/http/admission.py) on its own: counters, bounds and verdicts,
without a server or a model (milliseconds). The same rules against a real `inferd serve` are in
test_hostile_requests.py."""

from __future__ import annotations

import pytest

from inferd.errors import ContextTooLong, InvalidRequest, Overloaded
from inferd.server.http.admission import Admission, AdmissionLimits, ShuttingDown, all_text


def admission(**overrides) -> Admission:
    limits = dict(
        max_model_len=1024,
        seats=64,
        max_queued_requests=32,
        max_queued_tokens=100_000,
        max_prompts_per_request=16,
        max_bytes_per_token=4,
    )
    return Admission(AdmissionLimits(**{**limits, **overrides}))  # fmt: skip


def test_a_burst_fills_free_seats_before_anything_counts_as_waiting():
    adm = admission()
    held = [adm.admit(["hello"], n=1) for _ in range(64 + 32)]  # 64 seats free, 32 may wait
    assert adm.waiting() == 32
    with pytest.raises(Overloaded) as refused:
        adm.admit(["one more"], n=1)
    assert refused.value.retry_after_s >= 1
    for reservation in held:
        reservation.release()
    assert (adm.queued_requests, adm.queued_tokens, adm.seated) == (0, 0, 0)
    assert not adm.live


def test_started_requests_hold_seats_and_finished_ones_free_them():
    adm = admission(seats=2, max_queued_requests=1)
    first = adm.admit(["a", "b"], n=1)
    first.bind(["r0", "r1"])
    first.started("r0")
    first.started("r1")
    assert (adm.queued_requests, adm.seated) == (0, 2)
    adm.admit(["c"], n=1)  # waits for a seat: the one place in the queue
    with pytest.raises(Overloaded):
        adm.admit(["d"], n=1)
    first.finished("r0")  # a seat frees: c can start, d fits in the queue
    adm.admit(["d"], n=1)
    first.release()
    first.release()  # idempotent: the HTTP request's end releases again
    assert adm.seated == 0


def test_samples_of_a_started_request_each_hold_a_seat():
    adm = admission(seats=4, max_queued_requests=0)
    r = adm.admit(["a"], n=3)
    r.bind(["x"])
    r.started("x")
    assert adm.seated == 3
    adm.admit(["b"], n=1)  # the fourth seat
    with pytest.raises(Overloaded):
        adm.admit(["c"], n=1)


def test_one_request_may_not_carry_too_many_prompts():
    adm = admission()
    with pytest.raises(InvalidRequest) as e:
        adm.admit([[2, 818]] * 100_000, n=1)
    assert e.value.param == "prompt" and "--max-prompts-per-request" in e.value.message
    assert adm.queued_requests == 0


def test_text_too_long_for_the_context_is_refused_by_its_bytes_alone():
    adm = admission(max_bytes_per_token=4)
    adm.admit(["a" * (4 * 1023)], n=1)  # might fit: it needs at least 1023 tokens
    with pytest.raises(ContextTooLong) as e:
        adm.admit(["a" * (4 * 1024 + 1)], n=1)
    assert e.value.param == "prompt" and "max_model_len is 1024" in e.value.message
    with pytest.raises(ContextTooLong):
        adm.admit([[1] * 1024], n=1)  # token ids: exact
    unbounded = admission(max_bytes_per_token=None)
    unbounded.admit(["a" * 1_000_000], n=1)  # no byte bound known: the engine measures it


def test_queued_tokens_are_bounded_before_and_after_tokenizing():
    adm = admission(max_queued_tokens=3000, max_bytes_per_token=4)
    with pytest.raises(InvalidRequest):  # alone over the whole queue: never servable
        adm.admit([[1] * 800] * 4, n=1)
    first = adm.admit([[1] * 1000, [1] * 1000], n=1)
    with pytest.raises(Overloaded):  # could be served once the queue drains
        adm.admit([[1] * 1001], n=1)
    text = adm.admit(["word " * 400], n=1)  # at least 500 tokens by its bytes
    assert adm.queued_tokens == 2500
    with pytest.raises(Overloaded):
        text.tokenized([1100])  # its real length no longer fits next to the others
    text.tokenized([480])
    assert adm.queued_tokens == 2480
    first.release()
    text.release()
    assert adm.queued_tokens == 0


def test_nothing_is_admitted_while_draining():
    adm = admission()
    adm.draining = True
    with pytest.raises(ShuttingDown) as e:
        adm.admit(["a"], n=1)
    assert e.value.status == 503 and e.value.headers["Retry-After"]


def test_a_chat_is_measured_by_all_the_text_it_carries():
    messages = [{"role": "user", "content": [{"type": "text", "text": "abc"}]}, {"role": "x"}]
    assert all_text(messages) == "usertextabcx"


def test_each_sample_of_a_queued_request_needs_a_seat():
    adm = admission(seats=4, max_queued_requests=0)
    adm.admit(["a"], n=3)
    assert adm.waiting() == 0
    with pytest.raises(Overloaded):  # 3 + 2 samples on 4 seats: one would wait
        adm.admit(["b"], n=2)
    adm.admit(["b"], n=1)
    with pytest.raises(InvalidRequest) as e:  # more samples than seats and queue together
        admission(seats=4, max_queued_requests=2).admit(["c"], n=7)
    assert e.value.param == "n" and "--max-queued-requests" in e.value.message


def test_truncated_prompts_count_what_they_keep():
    adm = admission(max_queued_tokens=3000, max_bytes_per_token=4)
    held = adm.admit([[1] * 5000, "a" * 40_000], n=1, keep=100)  # cut to fit: not too long
    assert adm.queued_tokens == 200
    adm.admit(["a" * 40_000], n=1, keep=-1)  # -1: max_model_len tokens
    assert adm.queued_tokens == 200 + 1024
    with pytest.raises(ContextTooLong):
        adm.admit([[1] * 5000], n=1)
    held.release()
    assert adm.queued_tokens == 1024


def test_the_body_precheck_counts_truncated_prompts_as_the_route_does():
    import json

    from inferd.server.http.limits import precheck_prompts

    too_long = {"prompt": [1] * 5000, "max_tokens": 1}
    assert precheck_prompts(json.dumps(too_long).encode(), admission()).status == 400
    kept = {**too_long, "truncate_prompt_tokens": 100}
    assert precheck_prompts(json.dumps(kept).encode(), admission()) is None
    odd = {**too_long, "truncate_prompt_tokens": "x"}  # left to the route's validation
    assert precheck_prompts(json.dumps(odd).encode(), admission()) is None
