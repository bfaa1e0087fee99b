"""The tokenizer info of the embedded model's real tokenizer: the model's 262,144-id vocabulary,
EOS and end-of-turn as ends, the token bytes cached on disk, and a JSON schema constraining real
Gemma token ids."""

from __future__ import annotations

import numpy as np
import pytest

from inferd.structured import StructuredOutputsParams
from inferd.structured import tokenizer_info as tokenizer_info_module
from inferd.structured.bitmask import allocate_bitmask, bitmask_allows
from inferd.structured.manager import GrammarManager

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def gemma_tokenizer():
    from inferd.loader import open_checkpoint
    from inferd.tokenizer import checkpoint_tokenizer

    return checkpoint_tokenizer(open_checkpoint(None))


def test_gemma_tokenizer_info(gemma_tokenizer, monkeypatch):
    info = tokenizer_info_module.build_tokenizer_info(gemma_tokenizer, 262144)
    assert info.vocab_size == 262144 and info.bitmask_words == 8192
    assert info.eos_token_ids == (1, 106)  # <eos>, <end_of_turn>

    # The second build reads the cached token bytes instead of deriving them again.
    def no_derive(*args):
        raise AssertionError("the token bytes were derived again, not read from the cache")

    monkeypatch.setattr(tokenizer_info_module, "_derive", no_derive)
    info = tokenizer_info_module.build_tokenizer_info(gemma_tokenizer, 262144)

    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    with GrammarManager(info) as manager:
        matcher = manager.compile(StructuredOutputsParams(json=schema))
        good = gemma_tokenizer.encode('{"city": "Paris"}', add_special_tokens=False)
        bad = gemma_tokenizer.encode('{"city": 3}', add_special_tokens=False)
        assert matcher.validate_tokens(bad) < len(bad)
        assert matcher.accept_tokens(good) and matcher.is_complete
        bitmask = allocate_bitmask(1, info.bitmask_words)
        matcher.fill_bitmask(bitmask, 0)
        bits = np.unpackbits(bitmask.numpy().view(np.uint8), bitorder="little")
        assert np.flatnonzero(bits).tolist() == [1, 106]
        assert bitmask_allows(bitmask[0], 106)
        assert matcher.accept_tokens([106]) and matcher.is_terminated
