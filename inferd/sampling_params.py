"""Per-request sampling parameters with vLLM's names and defaults.

Everything a client can get wrong is checked here, once, when the object is built: a bad value
raises `InvalidRequest` (a ValueError) naming the parameter, the value and the allowed range,
with the parameter in `param` (the server turns it into HTTP 400). Checks that need the model
(vocabulary size) or the engine's limits live in `verify`. The module stays free of torch so the
HTTP layer can validate without importing it.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import math
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Any

from inferd.errors import InvalidRequest
from inferd.structured_params import StructuredOutputsParams

MAX_LOGPROBS = 20  # the OpenAI API's limit for top_logprobs: the default engine limit
MAX_STOP_STRING_LENGTH = 512  # characters: the default engine limit
MAX_LOGIT_BIAS = 100.0  # the OpenAI API's range for logit_bias values
# Below this temperature, dividing the logits would overflow into a one-hot distribution anyway,
# so the sampler takes the argmax (vLLM uses the same threshold).
GREEDY_TEMPERATURE = 1e-5
# The most candidates the infill sampler works on (its top_k's bound): it compares their texts.
INFILL_MAX_CANDIDATES = 1024


def _is_int(value: Any) -> bool:
    # bool subclasses int, but `top_k=True` is a client bug, not a number.
    return isinstance(value, Integral) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool)


def _check_float(name: str, value: Any, ok, allowed: str, param: str | None = None) -> float:
    """`value` as a plain float when it is a finite real number satisfying `ok`; `param` is the
    field to blame when `name` is not one (`logit_bias[5]`)."""
    try:
        number = float(value) if _is_real(value) else math.nan
    except OverflowError:  # an int too large for a float
        number = math.nan
    if not math.isfinite(number) or not ok(number):
        raise InvalidRequest(param or name, f"{name} must be {allowed}, got {value!r}")
    return number


def _check_int(name: str, value: Any, ok, allowed: str) -> int:
    if not _is_int(value) or not ok(int(value)):
        raise InvalidRequest(name, f"{name} must be {allowed}, got {value!r}")
    return int(value)


def _token_id(name: str, key: Any) -> int:
    """A token id given as an int, or as a decimal string (JSON object keys are strings)."""
    if _is_int(key):
        return int(key)
    if isinstance(key, str):
        try:
            return int(key.strip())
        except ValueError:
            pass
    raise InvalidRequest(name, f"{name} keys must be integer token ids, got {key!r}")


class RequestOutputKind(enum.IntEnum):
    """What a request's outputs hold (vLLM's names). CUMULATIVE: everything so far, each
    time; DELTA: only what is new since the request's previous output (its last one also carries
    the finish and the metrics), so a stream costs the same per token however long it grows;
    FINAL_ONLY: one output, the whole, when the request ends. Outputs come after each step
    only for a streaming request (`LLMEngine.add_request(stream=True)`, every server request);
    otherwise the one final output is cumulative whatever the kind."""

    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


@dataclass
class SamplingParams:
    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: off
    min_p: float = 0.0
    seed: int | None = None
    stop: str | list[str] | None = None  # a list after __post_init__
    stop_token_ids: list[int] | None = None  # a list after __post_init__
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    max_tokens: int | None = 16  # None: up to the context limit (the engine resolves it)
    min_tokens: int = 0
    logprobs: int | None = None  # top alternatives per generated token (0: the chosen one only)
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    logit_bias: dict[int, float] | None = None  # token id → added to its logit
    allowed_token_ids: list[int] | None = None  # only these may be sampled (vLLM's name)
    # Keep only the last k prompt tokens (-1: as many as max_model_len allows), as vLLM does.
    truncate_prompt_tokens: int | None = None
    # The reply must match a JSON schema / regex / choice / grammar (a dict is converted).
    structured_outputs: StructuredOutputsParams | None = None
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    # llama.cpp's fill-in-the-middle filter after top_k / top_p / min_p
    # (inferd/engine/sampling/infill_sampler.py): /infill's `samplers: [..., "infill"]`.
    infill_sampler: bool = False

    def __post_init__(self) -> None:
        self.output_kind = RequestOutputKind(self.output_kind)
        self.n = _check_int("n", self.n, lambda v: v >= 1, "an integer >= 1")
        self.temperature = _check_float(
            "temperature", self.temperature, lambda v: v >= 0, "a finite number >= 0"
        )
        self.top_p = _check_float("top_p", self.top_p, lambda v: 0 < v <= 1, "a number in (0, 1]")
        self.top_k = _check_int(
            "top_k", self.top_k, lambda v: v >= -1, "an integer >= -1 (0 or -1 disables it)"
        )
        self.min_p = _check_float("min_p", self.min_p, lambda v: 0 <= v <= 1, "a number in [0, 1]")
        for name in ("presence_penalty", "frequency_penalty"):
            value = _check_float(
                name, getattr(self, name), lambda v: -2 <= v <= 2, "a finite number in [-2, 2]"
            )
            setattr(self, name, value)
        self.repetition_penalty = _check_float(
            "repetition_penalty", self.repetition_penalty, lambda v: v > 0, "a finite number > 0"
        )
        if self.max_tokens is not None:
            self.max_tokens = _check_int(
                "max_tokens", self.max_tokens, lambda v: v >= 1, "None or an integer >= 1"
            )
        self.min_tokens = _check_int(
            "min_tokens", self.min_tokens, lambda v: v >= 0, "an integer >= 0"
        )
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise InvalidRequest(
                "min_tokens",
                f"min_tokens must be <= max_tokens ({self.max_tokens}), got {self.min_tokens}",
            )
        for name in ("logprobs", "prompt_logprobs"):
            if getattr(self, name) is not None:
                # The upper bound is the engine's (--max-logprobs): checked in `verify`.
                value = _check_int(name, getattr(self, name), lambda v: v >= 0,
                                   "None or an integer >= 0")  # fmt: skip
                setattr(self, name, value)
        if self.seed is not None:
            self.seed = _check_int("seed", self.seed, lambda v: True, "None or an integer")
        self.stop = self._normalize_stop(self.stop)
        self.stop_token_ids = self._normalize_stop_token_ids(self.stop_token_ids)
        self.logit_bias = self._normalize_logit_bias(self.logit_bias)
        self.allowed_token_ids = self._normalize_allowed(self.allowed_token_ids)
        if self.truncate_prompt_tokens is not None:
            self.truncate_prompt_tokens = _check_int(
                "truncate_prompt_tokens", self.truncate_prompt_tokens,
                lambda v: v >= 1 or v == -1, "None, -1 or an integer >= 1",
            )  # fmt: skip
        self.structured_outputs = self._normalize_structured_outputs(self.structured_outputs)
        if self.structured_outputs is not None:
            self._check_structured_combinations()
        if self.infill_sampler:
            self._check_infill_combinations()

    @staticmethod
    def _normalize_stop(stop: Any) -> list[str]:
        allowed = "a non-empty string or a list of non-empty strings"
        if stop is None:
            return []
        items = [stop] if isinstance(stop, str) else stop
        if not isinstance(items, list | tuple):
            raise InvalidRequest("stop", f"stop must be {allowed}, got {stop!r}")
        for s in items:
            # An empty stop string would match before every character and end every request.
            if not isinstance(s, str) or not s:
                raise InvalidRequest("stop", f"stop must be {allowed}, got {s!r} in {stop!r}")
        return list(items)

    @staticmethod
    def _normalize_stop_token_ids(ids: Any) -> list[int]:
        if ids is None:
            return []
        if not isinstance(ids, list | tuple) or not all(_is_int(t) for t in ids):
            message = f"stop_token_ids must be a list of integer token ids, got {ids!r}"
            raise InvalidRequest("stop_token_ids", message)
        return [int(t) for t in ids]

    @staticmethod
    def _normalize_logit_bias(bias: Any) -> dict[int, float] | None:
        if bias is None:
            return None
        if not isinstance(bias, dict):
            message = f"logit_bias must be a mapping of token id to bias, got {bias!r}"
            raise InvalidRequest("logit_bias", message)
        out: dict[int, float] = {}
        lim = MAX_LOGIT_BIAS
        for key, value in bias.items():
            token = _token_id("logit_bias", key)
            out[token] = _check_float(
                f"logit_bias[{token}]", value, lambda v: -lim <= v <= lim,
                f"a finite number in [{-lim:g}, {lim:g}]", param="logit_bias",
            )  # fmt: skip
        return out

    @staticmethod
    def _normalize_allowed(ids: Any) -> list[int] | None:
        if ids is None:
            return None
        if not isinstance(ids, list | tuple) or not ids or not all(_is_int(t) for t in ids):
            message = f"allowed_token_ids must be a non-empty list of token ids, got {ids!r}"
            raise InvalidRequest("allowed_token_ids", message)
        return sorted({int(t) for t in ids})

    def _check_structured_combinations(self) -> None:
        """A grammar decides when the reply ends (only EOS is allowed once it is complete) and
        which tokens may come: knobs that would contradict it are refused rather than
        producing a reply outside the grammar or a row with nothing left to sample."""
        for name, used in (
            ("ignore_eos", self.ignore_eos),
            ("min_tokens", self.min_tokens > 0),
            ("allowed_token_ids", self.allowed_token_ids is not None),
        ):
            if used:
                raise InvalidRequest(
                    name,
                    f"{name} cannot be combined with structured outputs "
                    f"({self.structured_outputs.field_name()}): the grammar decides which tokens "
                    "may come and when the reply ends",
                )

    def _check_infill_combinations(self) -> None:
        """The infill sampler filters a bounded candidate set and may end the reply by choosing
        an end-of-generation token: knobs that contradict either are refused."""
        if not 0 < self.top_k <= INFILL_MAX_CANDIDATES:
            raise InvalidRequest(
                "top_k",
                f"the infill sampler needs top_k in [1, {INFILL_MAX_CANDIDATES}] before it (it "
                f"works on the top-k candidates, as llama.cpp's documents), got {self.top_k}",
            )
        for name, used in (
            ("ignore_eos", self.ignore_eos),
            ("min_tokens", self.min_tokens > 0),
            ("allowed_token_ids", self.allowed_token_ids is not None),
            ("structured_outputs", self.structured_outputs is not None),
        ):
            if used:
                raise InvalidRequest(
                    name,
                    f"{name} cannot be combined with the infill sampler: it ends the reply by "
                    "choosing an end-of-generation token when that is likely enough",
                )

    @staticmethod
    def _normalize_structured_outputs(spec: Any) -> StructuredOutputsParams | None:
        if spec is None or isinstance(spec, StructuredOutputsParams):
            return spec
        if isinstance(spec, dict):
            return StructuredOutputsParams.from_dict(spec)
        raise InvalidRequest(
            "structured_outputs",
            "structured_outputs must be a StructuredOutputsParams or a mapping of its fields, "
            f"got {type(spec).__name__}",
        )

    def verify(
        self,
        vocab_size: int | None,
        max_n: int = 128,
        max_stop_strings: int = 16,
        max_stop_string_length: int = MAX_STOP_STRING_LENGTH,
        max_logprobs: int = MAX_LOGPROBS,
    ) -> None:
        """Checks that depend on the model and the engine's limits; raises InvalidRequest."""
        if self.n > max_n:
            raise InvalidRequest("n", f"n must be <= {max_n}, got {self.n}")
        if len(self.stop) > max_stop_strings:
            raise InvalidRequest(
                "stop", f"stop must hold at most {max_stop_strings} strings, got {len(self.stop)}"
            )
        longest = max(self.stop, key=len, default="")
        if len(longest) > max_stop_string_length:
            raise InvalidRequest(
                "stop",
                f"stop strings must be at most {max_stop_string_length} characters long, "
                f"got one of {len(longest)}",
            )
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and value > max_logprobs:
                raise InvalidRequest(
                    name, f"{name} must be <= {max_logprobs} (--max-logprobs), got {value}"
                )
        ids = [("stop_token_ids", t) for t in self.stop_token_ids]
        ids += [("logit_bias", t) for t in self.logit_bias or ()]
        ids += [("allowed_token_ids", t) for t in self.allowed_token_ids or ()]
        for name, token in ids:
            if token < 0 or (vocab_size is not None and token >= vocab_size):
                allowed = ">= 0" if vocab_size is None else f"in [0, {vocab_size})"
                raise InvalidRequest(name, f"{name} token ids must be {allowed}, got {token}")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE

    def clone(self) -> SamplingParams:
        return copy.deepcopy(self)

    def with_changes(self, **changes: Any) -> SamplingParams:
        """A copy with some fields replaced, validated again."""
        # NOTE: __post_init__ copies stop / stop_token_ids / logit_bias, so the copy shares no
        # mutable state with self.
        return dataclasses.replace(self, **changes)
