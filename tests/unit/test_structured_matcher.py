"""GrammarMatcher state: accepting (all or nothing), EOS and end-of-turn ending a reply, rollback
(also across an EOS taken after the grammar stopped), draft validation and per-position bitmask
rows for speculative decoding."""

from __future__ import annotations

import pytest
import torch
from structured_vocab import EOS, EOT, TOKENS, small_info

from inferd.structured import StructuredOutputsParams
from inferd.structured.bitmask import allocate_bitmask, bitmask_allows
from inferd.structured.manager import GrammarManager


@pytest.fixture(scope="module")
def manager():
    with GrammarManager(small_info()) as m:
        yield m


def ids(text: str) -> list[int]:
    return list(text.encode())


def allowed(matcher, info) -> set[int]:
    bitmask = allocate_bitmask(1, info.bitmask_words)
    matcher.fill_bitmask(bitmask, 0)
    return {t for t in range(info.vocab_size) if bitmask_allows(bitmask[0], t)}


def test_accept_is_all_or_nothing(manager):
    m = manager.compile(StructuredOutputsParams(regex="ab+c"))
    before = allowed(m, manager.info)
    assert not m.accept_tokens(ids("abx"))
    assert m.num_accepted == 0 and allowed(m, manager.info) == before
    assert m.accept_tokens(ids("ab")) and m.num_accepted == 2
    assert m.allows(ord("b")) and m.allows(ord("c")) and not m.allows(ord("a"))
    assert not m.allows(EOS)  # "ab" is not in the language yet


@pytest.mark.parametrize("end", [EOS, EOT])
def test_either_end_token_terminates_once_complete(manager, end):
    m = manager.compile(StructuredOutputsParams(regex="ab+"))
    assert m.accept_tokens(ids("ab")) and m.is_complete and not m.is_terminated
    assert m.allows(end) and m.allows(ord("b"))  # may end, or go on
    assert m.accept_tokens([end]) and m.is_terminated
    assert not m.allows(ord("b")) and not m.accept_tokens(ids("b"))
    assert m.accept_tokens([])  # nothing to add is fine


def test_stopped_grammar_allows_only_the_end_tokens(manager):
    m = manager.compile(StructuredOutputsParams(choice=["abc"]))
    assert m.accept_tokens([TOKENS.index(b"abc")])
    assert allowed(m, manager.info) == {EOS, EOT}
    assert m.accept_tokens([EOT]) and m.is_terminated


def test_rollback_restores_masks(manager):
    schema = {"type": "array", "items": {"type": "integer"}}
    m = manager.compile(StructuredOutputsParams(json=schema))
    masks = [allowed(m, manager.info)]
    text = ids("[12,") + [TOKENS.index(b"-1")] + ids("]")
    for t in text:
        assert m.accept_tokens([t])
        masks.append(allowed(m, manager.info))
    for k in range(len(text), 0, -1):
        m.rollback(1)
        assert allowed(m, manager.info) == masks[k - 1]
    with pytest.raises(ValueError, match="cannot roll back 1 tokens: 0 were accepted"):
        m.rollback(1)


@pytest.mark.parametrize("spec", [{"choice": ["ab"]}, {"regex": "ab+"}])
def test_rollback_over_an_end_token(manager, spec):
    # With "ab" the choice grammar has stopped when EOS comes (llguidance does not count that
    # EOS); the regex grammar has not (it does): rollback(1) must undo exactly the EOS in both.
    m = manager.compile(StructuredOutputsParams(**spec))
    assert m.accept_tokens(ids("ab")) and m.accept_tokens([EOS]) and m.is_terminated
    m.rollback(1)
    assert not m.is_terminated and m.num_accepted == 2 and m.allows(EOS)
    assert not m.allows(ord("a"))
    m.rollback(1)
    assert m.allows(ord("b")) and not m.allows(EOS)


def test_validate_tokens_reports_the_valid_draft_prefix(manager):
    m = manager.compile(StructuredOutputsParams(regex="ab+c"))
    assert m.validate_tokens(ids("abbcx")) == 4
    assert m.validate_tokens(ids("abbc") + [EOS, ord("a")]) == 5
    assert m.validate_tokens(ids("x")) == 0
    assert m.num_accepted == 0 and m.allows(ord("a"))


def test_draft_bitmask_rows_match_step_by_step_masks(manager):
    info = manager.info
    m = manager.compile(StructuredOutputsParams(regex="ab+c"))
    draft = ids("abbxb")  # valid up to "abb"
    bitmask = allocate_bitmask(len(draft) + 1, info.bitmask_words)
    bitmask.fill_(-1)
    filled = m.fill_bitmask_rows(bitmask, 0, draft)
    assert filled == 4 and m.num_accepted == 0
    step = manager.compile(StructuredOutputsParams(regex="ab+c"))
    for row in range(filled):
        expect = allocate_bitmask(1, info.bitmask_words)
        step.fill_bitmask(expect, 0)
        assert torch.equal(bitmask[row], expect[0])
        if row < filled - 1:
            step.accept_tokens([draft[row]])
    assert torch.equal(bitmask[filled], torch.full_like(bitmask[filled], -1))  # untouched


def test_bitmask_argument_checks(manager):
    m = manager.compile(StructuredOutputsParams(regex="a"))
    words = manager.info.bitmask_words
    with pytest.raises(ValueError, match="2-D int32 CPU"):
        m.fill_bitmask(torch.zeros(1, words, dtype=torch.int64), 0)
    with pytest.raises(ValueError, match=f"contiguous with {words} words"):
        m.fill_bitmask(torch.zeros(1, words + 1, dtype=torch.int32), 0)
    with pytest.raises(IndexError):
        m.fill_bitmask(torch.zeros(1, words, dtype=torch.int32), 1)


def test_clone_is_independent(manager):
    m = manager.compile(StructuredOutputsParams(regex="ab+c"))
    m.accept_tokens(ids("a"))
    twin = m.clone()
    assert twin.accept_tokens(ids("bc")) and twin.is_complete
    assert m.num_accepted == 1 and not m.is_complete and m.allows(ord("b"))
