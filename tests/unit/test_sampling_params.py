"""SamplingParams: vLLM defaults, normalisation, and a ValueError naming the parameter for every
value a client can get wrong."""

from __future__ import annotations

import math

import pytest

from inferd.sampling_params import MAX_LOGPROBS, SamplingParams

INVALID = [
    ("temperature", -1.0),
    ("temperature", math.nan),
    ("temperature", math.inf),
    ("temperature", "0.5"),
    ("top_p", 0.0),
    ("top_p", -0.1),
    ("top_p", 1.01),
    ("top_p", math.nan),
    ("top_k", -2),
    ("top_k", 2.5),
    ("top_k", True),
    ("top_k", "5"),
    ("min_p", -0.01),
    ("min_p", 1.01),
    ("min_p", math.nan),
    ("presence_penalty", -2.01),
    ("presence_penalty", 2.01),
    ("presence_penalty", math.inf),
    ("frequency_penalty", -2.01),
    ("frequency_penalty", 2.01),
    ("frequency_penalty", math.nan),
    ("repetition_penalty", 0.0),
    ("repetition_penalty", -1.0),
    ("repetition_penalty", math.inf),
    ("repetition_penalty", math.nan),
    ("max_tokens", 0),
    ("max_tokens", -5),
    ("max_tokens", 1.5),
    ("min_tokens", -1),
    ("logprobs", -1),
    ("prompt_logprobs", -1),
    ("allowed_token_ids", []),
    ("allowed_token_ids", [1, "2"]),
    ("truncate_prompt_tokens", 0),
    ("truncate_prompt_tokens", -2),
    ("n", 0),
    ("n", -3),
    ("stop", ""),
    ("stop", ["ok", ""]),
    ("stop", [3]),
    ("seed", 1.5),
    ("seed", "42"),
    ("stop_token_ids", ["a"]),
]


@pytest.mark.parametrize(("name", "value"), INVALID)
def test_invalid_value_raises_naming_the_parameter(name, value):
    with pytest.raises(ValueError, match=name) as err:
        SamplingParams(**{name: value})
    if name not in ("stop", "stop_token_ids"):
        assert repr(value) in str(err.value)  # the message quotes what was sent


def test_message_states_value_and_range():
    with pytest.raises(ValueError) as err:
        SamplingParams(temperature=-1.0)
    assert str(err.value) == "temperature must be a finite number >= 0, got -1.0"
    with pytest.raises(ValueError, match=r"top_p must be a number in \(0, 1\], got 0"):
        SamplingParams(top_p=0)


def test_min_tokens_above_max_tokens():
    with pytest.raises(ValueError, match="min_tokens"):
        SamplingParams(min_tokens=17, max_tokens=16)
    assert SamplingParams(min_tokens=16, max_tokens=16).min_tokens == 16
    assert SamplingParams(min_tokens=1000, max_tokens=None).min_tokens == 1000


@pytest.mark.parametrize(
    "bias", [{5: math.nan}, {5: math.inf}, {5: 100.5}, {"5": -101}, {"five": 1.0}, {"1.5": 1.0}]
)
def test_invalid_logit_bias(bias):
    with pytest.raises(ValueError, match="logit_bias"):
        SamplingParams(logit_bias=bias)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(top_p=1.0),
        dict(top_p=1e-9),
        dict(top_k=-1),
        dict(top_k=0),
        dict(top_k=1),
        dict(min_p=0.0),
        dict(min_p=1.0),
        dict(presence_penalty=2.0, frequency_penalty=-2.0),
        dict(presence_penalty=-2, frequency_penalty=2),
        dict(repetition_penalty=1e-3),
        dict(temperature=0),
        dict(max_tokens=1, min_tokens=1),
        dict(max_tokens=None),
        dict(logprobs=0, prompt_logprobs=MAX_LOGPROBS),
        dict(seed=0),
        dict(seed=-(2**70)),
        dict(logit_bias={7: 100, "8": -100.0}),
    ],
)
def test_valid_edge_values(kwargs):
    SamplingParams(**kwargs)


def test_defaults_match_vllm():
    p = SamplingParams()
    assert (p.n, p.temperature, p.top_p, p.top_k, p.min_p) == (1, 1.0, 1.0, 0, 0.0)
    assert (p.presence_penalty, p.frequency_penalty, p.repetition_penalty) == (0.0, 0.0, 1.0)
    assert (p.max_tokens, p.min_tokens, p.logprobs, p.prompt_logprobs) == (16, 0, None, None)
    assert p.stop == [] and p.stop_token_ids == [] and p.logit_bias is None
    assert p.skip_special_tokens and not p.ignore_eos and not p.include_stop_str_in_output


def test_normalisation():
    p = SamplingParams(stop="END", stop_token_ids=(4, 5), logit_bias={"12": 3, 7: -1})
    assert p.stop == ["END"]
    assert p.stop_token_ids == [4, 5]
    assert p.logit_bias == {12: 3.0, 7: -1.0}
    assert all(type(k) is int and type(v) is float for k, v in p.logit_bias.items())
    q = SamplingParams(temperature=1, top_p=1, min_p=0)
    assert type(q.temperature) is float and type(q.top_p) is float and type(q.min_p) is float


def test_greedy_threshold():
    assert SamplingParams(temperature=0.0).greedy
    assert SamplingParams(temperature=9e-6).greedy
    assert not SamplingParams(temperature=1e-4).greedy


def test_verify_context_limits():
    SamplingParams(n=128, stop=["a"] * 16, stop_token_ids=[0, 299], logit_bias={299: 1}).verify(300)
    with pytest.raises(ValueError, match="n must be <= 128"):
        SamplingParams(n=129).verify(300)
    with pytest.raises(ValueError, match="n must be <= 4"):
        SamplingParams(n=5).verify(300, max_n=4)
    with pytest.raises(ValueError, match="stop"):
        SamplingParams(stop=["a"] * 17).verify(300)
    with pytest.raises(ValueError, match=r"stop_token_ids .*\[0, 300\), got 300"):
        SamplingParams(stop_token_ids=[300]).verify(300)
    with pytest.raises(ValueError, match="logit_bias"):
        SamplingParams(logit_bias={300: 1.0}).verify(300)
    with pytest.raises(ValueError, match="logit_bias"):
        SamplingParams(logit_bias={"-1": 1.0}).verify(None)
    SamplingParams(logit_bias={10**6: 1.0}).verify(None)  # no vocabulary: only the lower bound
    with pytest.raises(ValueError, match=r"allowed_token_ids .*\[0, 300\), got 300"):
        SamplingParams(allowed_token_ids=[5, 300]).verify(300)


def test_engine_limits_on_stop_strings_and_logprobs_are_configurable():
    SamplingParams(stop=["x" * 512], logprobs=MAX_LOGPROBS, prompt_logprobs=MAX_LOGPROBS).verify(9)
    with pytest.raises(ValueError, match="at most 512 characters long, got one of 513") as err:
        SamplingParams(stop=["ok", "x" * 513]).verify(9)
    assert err.value.param == "stop"
    with pytest.raises(ValueError, match="at most 4 characters"):
        SamplingParams(stop=["abcde"]).verify(9, max_stop_string_length=4)
    for name in ("logprobs", "prompt_logprobs"):
        with pytest.raises(ValueError, match=rf"{name} must be <= 20 \(--max-logprobs\), got 21"):
            SamplingParams(**{name: 21}).verify(9)
        with pytest.raises(ValueError, match=rf"{name} must be <= 3") as err:
            SamplingParams(**{name: 4}).verify(9, max_logprobs=3)
        assert err.value.param == name
    SamplingParams(logprobs=50).verify(9, max_logprobs=50)


@pytest.mark.parametrize(
    "knob", [dict(ignore_eos=True), dict(min_tokens=2), dict(allowed_token_ids=[3])]
)
def test_knobs_that_contradict_a_grammar_are_refused_naming_both(knob):
    (name,) = knob
    with pytest.raises(ValueError, match=rf"{name} cannot be combined with structured outputs "
                       r"\(structured_outputs.regex\)") as err:  # fmt: skip
        SamplingParams(structured_outputs={"regex": "a+"}, **knob)
    assert err.value.param == name


def test_clone_and_with_changes_are_independent():
    p = SamplingParams(stop=["x"], stop_token_ids=[1], logit_bias={3: 1.0}, temperature=0.5)
    c = p.clone()
    c.stop.append("y")
    c.logit_bias[4] = 2.0
    assert p.stop == ["x"] and p.logit_bias == {3: 1.0}
    w = p.with_changes(top_k=5)
    assert (w.top_k, w.temperature, p.top_k) == (5, 0.5, 0)
    w.stop_token_ids.append(9)
    assert p.stop_token_ids == [1]
    with pytest.raises(ValueError, match="top_k"):
        p.with_changes(top_k=-7)
