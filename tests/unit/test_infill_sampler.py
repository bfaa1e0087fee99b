"""llama.cpp's infill sampler (engine/sampling/infill_sampler.py) on hand-made candidates and
logits: the EOG rule, prefix merging, the thresholds, the end of generation, the request checks,
and a seeded row's tokens alone and in a batch. No model; milliseconds."""

from __future__ import annotations

import msgspec
import pytest
import torch

from inferd.engine.sampling.infill_sampler import TokenPieces, infill_filter
from inferd.engine.sampling.sampler import Sampler, SamplingRow, make_generator
from inferd.errors import InvalidRequest
from inferd.sampling_params import SamplingParams

EOS = 0
TEXTS = {1: b"hel", 2: b"hell", 3: b"hello", 4: b"dummy", 5: b"x", 6: b"xy", 7: b"", 8: b"he"}


def piece(token: int) -> bytes:
    return TEXTS.get(token, b"t%d" % token)


def as_dict(pairs):
    return {t: round(p, 6) for t, p in pairs}


def test_likely_end_of_generation_keeps_only_eog_tokens():
    # EOG mass 0.11 × 3 × 3 candidates = 0.99 > 0.89, the rest: EOG only.
    kept = infill_filter([(EOS, 0.11), (4, 0.5), (5, 0.39)], {EOS, 9}, piece, EOS)
    assert as_dict(kept) == {EOS: 1.0}
    kept = infill_filter([(EOS, 0.1), (9, 0.01), (4, 0.5), (5, 0.39)], {EOS, 9}, piece, EOS)
    assert as_dict(kept) == {EOS: round(0.1 / 0.11, 6), 9: round(0.01 / 0.11, 6)}
    # Just below: 0.09 × 9 = 0.81 < 0.91, so the text tokens stay.
    kept = infill_filter([(EOS, 0.09), (4, 0.5), (5, 0.41)], {EOS}, piece, EOS)
    assert set(as_dict(kept)) == {EOS, 4, 5}


def test_prefixes_merge_into_the_likelier_token():
    # llama.cpp's documented example: "hel" 0.5, "hell" 0.2, "hello" 0.1, "dummy" 0.1 (+ a
    # little EOS) → "hel" 0.8, "dummy" 0.1 before the thresholds; "dummy" is then below 0.2.
    # The draw among those left follows their own probabilities ("hel" 0.5, EOS 0.001).
    kept = infill_filter([(1, 0.5), (2, 0.2), (3, 0.1), (4, 0.1), (EOS, 0.001)], {EOS}, piece, EOS)
    assert as_dict(kept) == {1: round(0.5 / 0.501, 6), EOS: round(0.001 / 0.501, 6)}
    # The longer token is likelier: the prefix gives its mass to it ("xy" 0.75, "dummy" 0.25,
    # which the second threshold, 1/3 with two texts left, then drops).
    kept = infill_filter([(5, 0.3), (6, 0.45), (4, 0.25)], set(), piece, EOS)
    assert as_dict(kept) == {6: 1.0}
    # Without token texts nothing merges (and 0.25 >= 1/4 with three texts left).
    kept = infill_filter([(5, 0.3), (6, 0.45), (4, 0.25)], set(), None, EOS)
    assert as_dict(kept) == {5: 0.3, 6: 0.45, 4: 0.25}
    # A token without text (special: 7) is a prefix of nothing: it does not swallow "x", "xy".
    kept = infill_filter([(7, 0.5), (5, 0.25), (6, 0.25)], set(), piece, EOS)
    assert as_dict(kept) == {7: round(0.5 / 0.75, 6), 5: round(0.25 / 0.75, 6)}


def test_merges_follow_the_order_of_likelihood():
    # "he" 0.3 takes "hel" 0.25 (0.55), then "hell" 0.2 and "hello" 0.15: everything into "he".
    kept = infill_filter([(8, 0.3), (1, 0.25), (2, 0.2), (3, 0.15), (4, 0.1)], set(), piece, EOS)
    assert as_dict(kept) == {8: 1.0}
    # Without the merges "he", "hel" and "hell" pass 0.2, then 1/4 of their 0.75.
    kept = infill_filter([(8, 0.3), (1, 0.25), (2, 0.2), (3, 0.15), (4, 0.1)], set(), None, EOS)
    assert set(as_dict(kept)) == {8, 1, 2}
    # Likeliest first: "hell" 0.5 takes "hello" 0.1 (0.6), then "hel" 0.4 goes into the
    # likelier "hell" and, having left, merges nothing more.
    kept = infill_filter([(1, 0.4), (2, 0.5), (3, 0.1)], set(), piece, EOS)
    assert as_dict(kept) == {2: 1.0}


def test_thresholds_and_the_end_of_generation():
    # Second threshold: after the first, 0.3 / 0.55 and 0.25 / 0.55 with 2 texts left: both
    # >= 1/3 stay; with three texts left at 0.25 each of 0.75, all >= 1/4 stay too.
    kept = infill_filter([(4, 0.3), (5, 0.25), (9, 0.45)], set(), piece, EOS)
    assert set(as_dict(kept)) == {4, 5, 9}
    kept = infill_filter([(4, 0.21), (5, 0.21), (9, 0.58)], set(), piece, EOS)
    # 0.21 / 1.0 < 1 / 4: only the likely one is left.
    assert as_dict(kept) == {9: 1.0}
    # Nothing likely enough: the generation ends with the row's end token.
    spread = [(t, 0.1) for t in range(10, 20)]
    assert infill_filter(spread, {EOS}, piece, EOS) == [(EOS, 1.0)]


def row(params, gen=None):
    return SamplingRow(params, [], [], gen, (EOS,))


def test_the_sampler_applies_it_after_top_k():
    logits = torch.full((1, 40), -5.0)
    logits[0, 1], logits[0, 2], logits[0, 4] = 3.0, 2.5, 1.0  # "hel", "hell", "dummy"
    pieces = TokenPieces(lambda: FakeInfo())
    params = SamplingParams(top_k=3, top_p=0.99, infill_sampler=True)
    sampler = Sampler(pieces=pieces)
    tokens = sampler(logits.expand(400, -1), [row(params)] * 400).token_ids
    assert set(tokens) == {1}  # "hell" merged into "hel"; "dummy" below 0.2
    plain = Sampler()(logits.expand(400, -1), [row(params.with_changes(infill_sampler=False))]
                      * 400).token_ids  # fmt: skip
    assert {1, 2} <= set(plain)
    # EOS likely enough: the generation ends.
    logits[0, EOS] = 2.0
    assert set(sampler(logits.expand(50, -1), [row(params)] * 50).token_ids) == {EOS}


class FakeInfo:
    """The grammar engine's TokenizerInfo, as far as TokenPieces reads it."""

    class ll_tokenizer:  # noqa: N801 - the attribute's name
        vocab_size = 40

        @staticmethod
        def is_special_token(t):
            return t == 7

        @staticmethod
        def decode_bytes(ids):
            return piece(ids[0])


def test_a_seeded_row_gets_the_same_tokens_alone_and_in_a_batch():
    params = SamplingParams(top_k=40, top_p=0.99, seed=11, infill_sampler=True)
    others = [
        SamplingParams(),
        SamplingParams(top_k=5, seed=3),
        SamplingParams(top_k=40, infill_sampler=True),
        SamplingParams(temperature=0),
    ]

    def run(neighbours: int) -> list[int]:
        sampler, gen, out = Sampler(seed=7, pieces=TokenPieces(FakeInfo)), make_generator(11), []
        for step in range(16):
            g = torch.Generator().manual_seed(step)
            mine = torch.randn(1, 40, generator=g) * 1.5
            noise = torch.randn(neighbours, 40, generator=g) * 3
            at = step % (neighbours + 1)
            logits = torch.cat([noise[:at], mine, noise[at:]])
            rows = [row(q, make_generator(3) if q.seed else None) for q in others[:neighbours]]
            rows.insert(at, row(params, gen))
            out.append(sampler(logits, rows).token_ids[at])
        return out

    alone = run(0)
    assert alone == run(4) and alone == run(2)
    assert len(set(alone)) > 2  # it really samples


@pytest.mark.parametrize(
    "changes, param",
    [
        ({"top_k": 0}, "top_k"),
        ({"top_k": 2000}, "top_k"),
        ({"ignore_eos": True}, "ignore_eos"),
        ({"min_tokens": 2}, "min_tokens"),
        ({"allowed_token_ids": [1, 2]}, "allowed_token_ids"),
        ({"structured_outputs": {"regex": "a+"}}, "structured_outputs"),
    ],
)
def test_what_the_infill_sampler_cannot_be_combined_with(changes, param):
    with pytest.raises(InvalidRequest) as e:
        SamplingParams(**{"top_k": 40, "infill_sampler": True, **changes})
    assert e.value.param == param, str(e.value)


def test_the_field_crosses_to_the_engine_core_process():
    from inferd.engine.core.core_output import CoreRequest
    from inferd.engine.transport import ipc

    params = SamplingParams(top_k=40, top_p=0.9, infill_sampler=True)
    add = ipc.Add(CoreRequest("r", [1, 2], params, 8, 0.0))
    assert ipc.decode_to_core(ipc.encode(add)).request.params.infill_sampler is True
    # A front end that does not know the field (an older one) sends none: off.
    raw = msgspec.msgpack.decode(ipc.encode(add))
    del raw["request"]["params"]["infill_sampler"]
    older = ipc.decode_to_core(msgspec.msgpack.encode(raw))
    assert older.request.params.infill_sampler is False and older.request.params.top_k == 40
