"""One request's timeline, for a client that asked (`"return_timeline": true` on a server
started with `--enable-request-timeline`) and, at debug level, for the server log.

    {"request_id": "cmpl-...-0",
     "events": [{"event": "arrived", "t": 0.0}, {"event": "queued", "t": 0.0009},
                {"event": "scheduled", "t": 0.0011}, {"event": "first_token", "t": 0.21},
                {"event": "preempted", "t": 0.9}, ..., {"event": "finished", "t": 1.7}],
     "queue_s": ..., "prefill_s": ..., "decode_s": ..., "inference_s": ..., "e2e_s": ...,
     "prompt_tokens": 12, "cached_prompt_tokens": 0, "generation_tokens": 16,
     "preemptions": 1}

Times are seconds since the request arrived at the server; the intervals are vLLM's (see
inferd/outputs.py RequestMetrics), the ones /metrics aggregates.
"""

from __future__ import annotations

import logging
from typing import Any

from inferd.outputs import RequestOutput

log = logging.getLogger("inferd.timeline")


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 6)


def timeline_json(out: RequestOutput) -> dict[str, Any]:
    m = out.metrics
    if m is None:
        return {"request_id": out.request_id, "events": []}
    return {
        "request_id": out.request_id,
        "events": [{"event": name, "t": round(t, 6)} for name, t in m.timeline()],
        "queue_s": _round(m.queue_time),
        "prefill_s": _round(m.prefill_time),
        "decode_s": _round(m.decode_time),
        "inference_s": _round(m.inference_time),
        "e2e_s": _round(m.e2e_latency),
        "prompt_tokens": len(out.prompt_token_ids),
        "cached_prompt_tokens": m.num_cached_tokens,
        "generation_tokens": m.num_generation_tokens,
        "preemptions": m.num_preemptions,
    }


def log_timeline(out: RequestOutput) -> None:
    """Output observer: a finished request's timeline at debug level."""
    if out.finished and out.metrics is not None and log.isEnabledFor(logging.DEBUG):
        events = ", ".join(f"{name} {t * 1000:.1f} ms" for name, t in out.metrics.timeline())
        log.debug("%s: %s; %d prompt tokens (%d cached), %d generated, %d preemption(s)",
                  out.request_id, events, len(out.prompt_token_ids), out.metrics.num_cached_tokens,
                  out.metrics.num_generation_tokens, out.metrics.num_preemptions)  # fmt: skip
