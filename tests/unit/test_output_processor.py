"""The front end's output processor fed with fabricated core outputs (new token ids, logprobs,
finish reasons): text by incremental detokenization, stop strings across token boundaries with
their holdback and the SampleFinish that ends them in the core, tokens after a stop never shown,
stop tokens never text, a length finish flushing, n > 1 assembly, logprob token strings,
streaming versus final-only requests. A tiny trained tokenizer; no model."""

from __future__ import annotations

import pytest
from tiny_models import make_tiny_checkpoint

from inferd.engine.core.core_output import CoreOutput, RequestEvents, SampleDelta, SampleFinish
from inferd.engine.frontend.output_processor import OutputProcessor
from inferd.engine.scheduling.step import TokenLogprobs
from inferd.sampling_params import RequestOutputKind, SamplingParams
from inferd.tokenizer import Tokenizer

PROMPT = [5, 6, 7]


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    folder = make_tiny_checkpoint("llama", tmp_path_factory.mktemp("tok") / "llama")
    return Tokenizer.from_hf_dir(folder)


def news(rid: str, *samples: SampleDelta, t: float = 1.0, finished: bool = False, **kw):
    return CoreOutput(rid, list(samples), t, RequestEvents(0.5, 0.6, 2, ()), finished=finished,
                      **kw)  # fmt: skip


def processor(tok, rid="r", stream=True, **params) -> OutputProcessor:
    out = OutputProcessor(tok)
    out.add_request(rid, None, PROMPT, SamplingParams(**params), 0.0, params.get("max_tokens"),
                    stream)  # fmt: skip
    return out


def words(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def test_text_grows_by_detokenizing_and_metrics_follow_the_core(tok):
    ids = words(tok, "The quick brown fox")
    out = processor(tok, max_tokens=len(ids))
    seen = []
    for i, t in enumerate(ids):
        last = i == len(ids) - 1
        delta = SampleDelta(0, [t], finish_reason="length" if last else None)
        (result,), finishes = out.process([news("r", delta, t=10.0 + i, finished=last)])
        seen.append(result.outputs[0].text)
        assert finishes == []
    assert seen[-1] == tok.decode(ids) and result.finished
    assert result.outputs[0].token_ids == ids and result.outputs[0].finish_reason == "length"
    m = result.metrics
    assert (m.first_token_time, m.last_token_time, m.finished_time) == (10.0, 10.0 + i, 10.0 + i)
    assert (m.queued_time, m.first_scheduled_time, m.num_cached_tokens) == (0.5, 0.6, 2)
    assert m.num_generation_tokens == len(ids) and not out.has_unfinished()


def test_a_stop_string_across_tokens_ends_the_sample_and_tells_the_core(tok):
    ids = words(tok, "The quick brown fox jumps over")
    text = tok.decode(ids)
    pieces = [tok.decode(ids[: i + 1]) for i in range(len(ids))]
    # A stop string made of the end of one token's text and the start of the next one's.
    k = next(i for i in range(1, len(ids) - 1) if len(pieces[i]) - len(pieces[i - 1]) >= 2)
    stop = pieces[k][-1] + pieces[k + 1][len(pieces[k])]
    out = processor(tok, stop=[stop], max_tokens=50)
    shown, finishes = [], []
    for t in ids[: k + 2]:
        results, ends = out.process([news("r", SampleDelta(0, [t]))])
        shown += [r.outputs[0].text for r in results]
        finishes += ends
    assert finishes == [SampleFinish("r", 0)]
    final = results[-1]
    assert final.finished and final.outputs[0].finish_reason == "stop"
    assert final.outputs[0].stop_reason == stop and final.outputs[0].text == text[: text.find(stop)]
    # While it ran, the last len(stop) - 1 characters were held back: nothing shown was taken back.
    assert all(final.outputs[0].text.startswith(s) for s in shown)
    # What the core computed meanwhile is dropped: the request is done here.
    assert out.process([news("r", SampleDelta(0, [ids[-1]]))]) == ([], [])


def test_tokens_after_a_stop_in_one_step_are_never_shown(tok):
    ids = words(tok, "The quick brown fox")
    stop = tok.decode(ids[:2])[-2:]
    out = processor(tok, stop=[stop], max_tokens=50, include_stop_str_in_output=True)
    (result,), finishes = out.process([news("r", SampleDelta(0, ids))])
    assert finishes == [SampleFinish("r", 0)]
    assert result.outputs[0].token_ids == ids[:2]  # up to the token that completed the stop
    assert result.outputs[0].text == tok.decode(ids[:2])  # the stop string itself kept


def test_a_stop_token_ends_the_text_where_it_is(tok):
    ids = words(tok, "The quick")
    out = processor(tok, max_tokens=50)
    delta = SampleDelta(0, [*ids, 2], finish_reason="stop", stop_reason=2)
    (result,), _ = out.process([news("r", delta, finished=True)])
    c = result.outputs[0]
    assert c.token_ids == [*ids, 2] and c.text == tok.decode(ids) and c.stop_reason == 2


def test_only_streaming_requests_are_reported_before_they_finish(tok):
    out = OutputProcessor(tok)
    for rid, stream in (("quiet", False), ("loud", True)):
        out.add_request(rid, None, PROMPT, SamplingParams(max_tokens=2), 0.0, 2, stream)
    first, _ = out.process([news(r, SampleDelta(0, [40])) for r in ("quiet", "loud")])
    assert [r.request_id for r in first] == ["loud"]
    done = SampleDelta(0, [41], finish_reason="length")
    last, _ = out.process([news(r, done, finished=True) for r in ("quiet", "loud")])
    assert [r.request_id for r in last] == ["quiet", "loud"] and all(r.finished for r in last)


def test_n_samples_are_assembled_in_index_order_and_end_together(tok):
    out = processor(tok, n=2, temperature=1.0, max_tokens=2)
    (first,), _ = out.process([news("r", SampleDelta(0, [40]), SampleDelta(1, [41]))])
    assert [c.index for c in first.outputs] == [0, 1] and not first.finished
    end = [
        SampleDelta(0, [42], finish_reason="length"),
        SampleDelta(1, [43], finish_reason="length"),
    ]
    (last,), _ = out.process([news("r", *end, finished=True)])
    assert [c.token_ids for c in last.outputs] == [[40, 42], [41, 43]] and last.finished


def test_logprobs_get_their_token_strings(tok):
    ids = words(tok, "The quick")
    out = processor(tok, logprobs=1, max_tokens=5, prompt_logprobs=0)
    lps = [TokenLogprobs([t, 9], [-0.5, -1.5], [1, 2]) for t in ids]
    prompt = [TokenLogprobs([6], [-2.0], [3]), TokenLogprobs([7], [-1.0], [1])]
    (result,), _ = out.process([news("r", SampleDelta(0, ids, lps), new_prompt_logprobs=prompt)])
    entries = result.outputs[0].logprobs
    assert [e[t].decoded_token for e, t in zip(entries, ids, strict=True)] == [
        tok.decode([t], skip_special_tokens=False) for t in ids
    ]
    assert entries[0][9].rank == 2 and result.outputs[0].cumulative_logprob == -0.5 * len(ids)
    assert result.prompt_logprobs[0] is None and result.prompt_logprobs[1][6].logprob == -2.0


def test_an_abort_or_an_error_from_the_core_ends_the_request(tok):
    out = processor(tok, max_tokens=5)
    (result,), _ = out.process([news("r", SampleDelta(0, [], finish_reason="error"), finished=True,
                                     error="RuntimeError: device lost")])  # fmt: skip
    assert result.finished and result.error == "RuntimeError: device lost"
    assert result.outputs[0].finish_reason == "error" and not out.has_unfinished()


def test_a_stream_interval_sends_the_first_token_then_every_nth_and_the_end(tok):
    ids = words(tok, "The quick brown fox jumps over the lazy dog")
    assert len(ids) >= 8
    out = OutputProcessor(tok, stream_interval=3)
    out.add_request("r", None, PROMPT, SamplingParams(max_tokens=len(ids)), 0.0, len(ids), True)
    counts = []
    for i, t in enumerate(ids):
        last = i == len(ids) - 1
        delta = SampleDelta(0, [t], finish_reason="length" if last else None)
        results, _ = out.process([news("r", delta, finished=last)])
        counts += [len(r.outputs[0].token_ids) for r in results]
    expected = [1, *range(4, len(ids), 3)]
    assert counts == (expected if expected[-1] == len(ids) else [*expected, len(ids)])
    assert results[-1].finished and results[-1].outputs[0].text == tok.decode(ids)


def test_a_stream_interval_still_ends_a_stop_string_at_once(tok):
    ids = words(tok, "The quick brown fox jumps over")
    stop = tok.decode(ids[:3]).split()[-1]  # the third word: ends the sample at token 3
    out = OutputProcessor(tok, stream_interval=16)
    out.add_request("r", None, PROMPT, SamplingParams(stop=[stop], max_tokens=50), 0.0, 50, True)
    seen, finishes = [], []
    for t in ids:
        results, ends = out.process([news("r", SampleDelta(0, [t]))])
        seen += results
        finishes += ends
        if finishes:
            break
    assert finishes == [SampleFinish("r", 0)] and seen[-1].finished
    assert len(seen) == 2  # the first token's output, then the stop's: none between them
    assert not seen[-1].outputs[0].text.endswith(stop)


def test_a_stream_interval_below_one_is_refused(tok):
    with pytest.raises(ValueError, match="stream_interval"):
        OutputProcessor(tok, stream_interval=0)


def stream_of(tok, ids, stream_interval=1, n=1, **params):
    """Feed `ids` one per step to each of `n` samples, once as a DELTA stream and once as a
    cumulative one; both streams' outputs."""
    runs = []
    for kind in (RequestOutputKind.DELTA, RequestOutputKind.CUMULATIVE):
        out = OutputProcessor(tok, stream_interval)
        sp = SamplingParams(n=n, output_kind=kind, max_tokens=len(ids), **params)
        out.add_request("r", None, PROMPT, sp, 0.0, len(ids), True)
        results = []
        for i, t in enumerate(ids):
            last = i == len(ids) - 1
            lps = [TokenLogprobs([t, 3], [-0.5, -1.5], [1, 2])] if "logprobs" in params else None
            deltas = [SampleDelta(k, [t], lps, "length" if last else None) for k in range(n)]
            results += out.process([news("r", *deltas, finished=last)])[0]
            if not out.has_unfinished():
                break
        runs.append(results)
    return runs


@pytest.mark.parametrize("interval", [1, 3])
@pytest.mark.parametrize("stop", [None, ["brown f", "lazy"]])
def test_delta_outputs_add_up_to_the_cumulative_ones(tok, stop, interval):
    ids = words(tok, "The quick brown fox jumps over the lazy dog")
    deltas, whole = stream_of(tok, ids, interval, n=2, stop=stop, logprobs=1)
    assert len(deltas) == len(whole) and all(d.delta for d in deltas)
    for k in range(2):
        text, tokens, entries = "", [], []
        for d, w in zip(deltas, whole, strict=True):
            for c in (c for c in d.outputs if c.index == k):
                text, tokens, entries = text + c.text, tokens + c.token_ids, entries + c.logprobs
            (cw,) = (c for c in w.outputs if c.index == k)
            assert (text, tokens, entries) == (cw.text, cw.token_ids, cw.logprobs)  # step by step
        final = next(c for c in deltas[-1].outputs if c.index == k)
        assert (final.finish_reason, final.stop_reason) == (cw.finish_reason, cw.stop_reason)
    assert deltas[-1].finished and deltas[-1].metrics.num_generation_tokens == (
        whole[-1].metrics.num_generation_tokens
    )


def test_a_delta_holds_back_a_stop_string_start_and_never_repeats_a_finish(tok):
    ids = words(tok, "The quick brown fox jumps")
    (deltas, _) = stream_of(tok, ids, stop=["fox jumps"])
    text = "".join(c.text for d in deltas for c in d.outputs)
    assert text == tok.decode(ids).split("fox jumps")[0]
    finishes = [c.finish_reason for d in deltas for c in d.outputs if c.finish_reason]
    assert finishes == ["stop"] and deltas[-1].finished
    assert all(len(c.token_ids) <= 1 for d in deltas for c in d.outputs)  # only each step's


def test_final_only_requests_get_one_cumulative_output(tok):
    ids = words(tok, "The quick brown fox")
    out = OutputProcessor(tok)
    sp = SamplingParams(output_kind=RequestOutputKind.FINAL_ONLY, max_tokens=len(ids))
    out.add_request("r", None, PROMPT, sp, 0.0, len(ids), True)
    results = []
    for i, t in enumerate(ids):
        last = i == len(ids) - 1
        delta = SampleDelta(0, [t], finish_reason="length" if last else None)
        results += out.process([news("r", delta, finished=last)])[0]
    (result,) = results
    assert result.outputs[0].token_ids == ids and not result.delta
