"""--speculative-config parsing: vLLM's JSON, defaults, and one clear error per bad key."""

from __future__ import annotations

import pytest

from inferd.spec_decode import SpeculativeConfig


def test_the_issue_flag_parses_from_a_string_a_dict_or_a_config():
    flag = (
        '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, '
        '"prompt_lookup_min": 2}'
    )
    c = SpeculativeConfig.parse(flag)
    assert (c.method, c.num_speculative_tokens, c.prompt_lookup_max, c.prompt_lookup_min) == (
        "ngram",
        4,
        4,
        2,
    )
    assert SpeculativeConfig.parse(c.to_dict()) == c
    assert SpeculativeConfig.parse(c) is c
    assert SpeculativeConfig.parse(None) is None


def test_lookup_defaults_as_vllm():
    both = SpeculativeConfig.parse({"method": "ngram", "num_speculative_tokens": 3})
    assert (both.prompt_lookup_min, both.prompt_lookup_max) == (5, 5)
    only_max = SpeculativeConfig.parse(
        {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 7}
    )
    assert (only_max.prompt_lookup_min, only_max.prompt_lookup_max) == (7, 7)
    only_min = SpeculativeConfig.parse(
        {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2}
    )
    assert (only_min.prompt_lookup_min, only_min.prompt_lookup_max) == (2, 2)


def test_vllm_model_spelling_of_the_method():
    for model in ("ngram", "[ngram]"):
        c = SpeculativeConfig.parse({"model": model, "num_speculative_tokens": 2})
        assert c.method == "ngram"
    assert SpeculativeConfig.parse({"method": "[ngram]", "num_speculative_tokens": 2}).method == (
        "ngram"
    )


@pytest.mark.parametrize(
    "raw, message",
    [
        ("{not json", "JSON object"),
        ("[1, 2]", "JSON object"),
        ({"method": "eagle", "num_speculative_tokens": 2}, "method must be one of ngram"),
        ({"num_speculative_tokens": 2}, 'needs "method"'),
        ({"model": "some/draft-model", "num_speculative_tokens": 2}, "no draft models"),
        ({"method": "ngram"}, "needs num_speculative_tokens"),
        ({"method": "ngram", "num_speculative_tokens": 0}, r"num_speculative_tokens .*\[1, 32\]"),
        ({"method": "ngram", "num_speculative_tokens": 33}, r"num_speculative_tokens .*\[1, 32\]"),
        ({"method": "ngram", "num_speculative_tokens": 2.5}, "must be an integer"),
        ({"method": "ngram", "num_speculative_tokens": True}, "must be an integer"),
        ({"method": "ngram", "num_speculative_tokens": "4"}, "must be an integer"),
        (
            {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 40},
            r"prompt_lookup_max .*\[1, 32\]",
        ),
        (
            {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 0},
            r"prompt_lookup_min .*\[1, 32\]",
        ),
        (
            {
                "method": "ngram",
                "num_speculative_tokens": 2,
                "prompt_lookup_min": 4,
                "prompt_lookup_max": 3,
            },
            r"prompt_lookup_min \(4\) must be <= prompt_lookup_max \(3\)",
        ),
        (
            {"method": "ngram", "num_speculative_tokens": 2, "draft_tensor_parallel_size": 1},
            "'draft_tensor_parallel_size' is not supported",
        ),
        ({"method": "ngram", "num_speculative_tokens": 2, "typo": 1}, "'typo' is not supported"),
    ],
)
def test_bad_configs_name_the_key_and_the_limit(raw, message):
    with pytest.raises(ValueError, match=message):
        SpeculativeConfig.parse(raw)


def test_direct_construction_validates_too():
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        SpeculativeConfig(num_speculative_tokens=-1)
    with pytest.raises(ValueError, match="method"):
        SpeculativeConfig(num_speculative_tokens=2, method="medusa")
