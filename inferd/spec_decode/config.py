"""`SpeculativeConfig`: vLLM's `--speculative-config` JSON for n-gram prompt lookup.

    --speculative-config '{"method": "ngram", "num_speculative_tokens": 4,
                           "prompt_lookup_max": 4, "prompt_lookup_min": 2}'

The same value arrives as a CLI string, a dict (`LLM(speculative_config={...})`), an existing
`SpeculativeConfig`, or None (no speculation); `SpeculativeConfig.parse` takes all four. Defaults
follow vLLM: `num_speculative_tokens` is required; when neither lookup bound is given both are 5,
when one is given the other takes its value. vLLM's spelling `"model": "ngram"` (or "[ngram]")
in place of `"method"` is accepted too. Every other key is refused by name: a key that vLLM knows
but that only concerns draft models would otherwise be silently ignored here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

METHODS = ("ngram",)
DEFAULT_LOOKUP = 5  # vLLM's value when neither prompt_lookup_min nor prompt_lookup_max is given
# vLLM's rejection sampler caps the drafts of one step at 32 (MAX_SPEC_LEN); the same cap here.
MAX_SPECULATIVE_TOKENS = 32
# Every n in [min, max] is one more dictionary entry per token of each sequence (ngram.py), so
# the span is bounded; 32 is far past the lengths that find anything a shorter n-gram would not.
MAX_LOOKUP = 32
KNOWN_KEYS = ("method", "model", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min")


@dataclass(frozen=True)
class SpeculativeConfig:
    """Propose up to `num_speculative_tokens` tokens per step by matching the last n tokens of a
    sequence, n from `prompt_lookup_max` down to `prompt_lookup_min`, against its earlier tokens."""

    num_speculative_tokens: int
    prompt_lookup_max: int = DEFAULT_LOOKUP
    prompt_lookup_min: int = DEFAULT_LOOKUP
    method: str = "ngram"

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(
                f"speculative_config method must be one of {', '.join(METHODS)}, "
                f"got {self.method!r}"
            )
        _check_int("num_speculative_tokens", self.num_speculative_tokens, MAX_SPECULATIVE_TOKENS)
        _check_int("prompt_lookup_max", self.prompt_lookup_max, MAX_LOOKUP)
        _check_int("prompt_lookup_min", self.prompt_lookup_min, MAX_LOOKUP)
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(
                f"speculative_config prompt_lookup_min ({self.prompt_lookup_min}) must be <= "
                f"prompt_lookup_max ({self.prompt_lookup_max})"
            )

    @classmethod
    def parse(cls, value: SpeculativeConfig | Mapping[str, Any] | str | None):
        """A config from a JSON string (the CLI flag), a dict, a config, or None (returns None:
        speculation off). Raises ValueError naming the offending key."""
        if value is None or isinstance(value, SpeculativeConfig):
            return value
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as e:
                raise ValueError(f"--speculative-config must be a JSON object: {e}") from None
        if not isinstance(value, Mapping):
            raise ValueError(
                f"speculative_config must be a JSON object (a dict), got {type(value).__name__}"
            )
        return cls.from_dict(value)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> SpeculativeConfig:
        unknown = [k for k in raw if k not in KNOWN_KEYS]
        if unknown:
            raise ValueError(
                f"speculative_config key {unknown[0]!r} is not supported; the n-gram method "
                f"takes {', '.join(KNOWN_KEYS)}"
            )
        method = _method(raw.get("method"), raw.get("model"))
        if raw.get("num_speculative_tokens") is None:
            raise ValueError("speculative_config needs num_speculative_tokens (an integer >= 1)")
        low, high = raw.get("prompt_lookup_min"), raw.get("prompt_lookup_max")
        # Checked as given, before one bound is copied into the other: the error names the key
        # the user wrote.
        for name, value in (("prompt_lookup_min", low), ("prompt_lookup_max", high)):
            if value is not None:
                _check_int(name, value, MAX_LOOKUP)
        if low is None and high is None:
            low = high = DEFAULT_LOOKUP
        elif low is None:
            low = high
        elif high is None:
            high = low
        return cls(
            num_speculative_tokens=raw["num_speculative_tokens"],
            prompt_lookup_max=high,
            prompt_lookup_min=low,
            method=method,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "num_speculative_tokens": self.num_speculative_tokens,
            "prompt_lookup_max": self.prompt_lookup_max,
            "prompt_lookup_min": self.prompt_lookup_min,
        }


def _method(method: Any, model: Any) -> str:
    """vLLM names the method by `method`, or (older spelling) by `"model": "ngram"`."""
    if model is not None and model not in ("ngram", "[ngram]"):
        raise ValueError(
            f"speculative_config model {model!r} is not supported: inferd has no draft models; "
            f'use {{"method": "ngram"}}'
        )
    if method is None:
        if model is None:
            raise ValueError('speculative_config needs "method" (one of: ngram)')
        return "ngram"
    if method == "[ngram]":
        return "ngram"
    if method not in METHODS:
        raise ValueError(
            f"speculative_config method must be one of {', '.join(METHODS)}, got {method!r}"
        )
    return method


def _check_int(name: str, value: Any, high: int) -> None:
    # bool is an int subclass; `true` in JSON is a mistake, not 1.
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(
            f"speculative_config {name} must be an integer, got {type(value).__name__} {value!r}"
        )
    if not 1 <= value <= high:
        raise ValueError(f"speculative_config {name} must be in [1, {high}], got {value}")
