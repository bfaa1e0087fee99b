"""Speculative decoding by n-gram prompt lookup (vLLM's `"method": "ngram"`).

    config.py     SpeculativeConfig: the --speculative-config JSON, validated
    ngram.py      NgramProposer: drafts from each sequence's own earlier tokens; draft_room
    planner.py    how many drafts to verify: expected tokens per second, from each sequence's
                  acceptance and the measured cost of a step by its rows
    rejection.py  verify_greedy / verify_sampled: which drafts to keep, and the next token
    metrics.py    SpecDecodeMetrics: vLLM's spec_decode_* counters

The engine side (scheduling, KV, sampling the rows) is inferd/engine/scheduling/speculative.py.

A decode step of a sequence with drafts computes the last token plus the drafts (k + 1 rows),
verification keeps the accepted prefix and adds one token of the target model, so each step
emits 1 .. k + 1 tokens with the model's own output distribution (token for token under greedy).
"""

from __future__ import annotations

from inferd.spec_decode.config import SpeculativeConfig
from inferd.spec_decode.metrics import SpecDecodeMetrics
from inferd.spec_decode.ngram import NgramIndex, NgramProposer, draft_room
from inferd.spec_decode.planner import AcceptanceEstimate, StepCosts, plan_drafts
from inferd.spec_decode.rejection import Verified, verify_greedy, verify_sampled

__all__ = [
    "AcceptanceEstimate",
    "NgramIndex",
    "NgramProposer",
    "SpecDecodeMetrics",
    "SpeculativeConfig",
    "StepCosts",
    "Verified",
    "draft_room",
    "plan_drafts",
    "verify_greedy",
    "verify_sampled",
]
