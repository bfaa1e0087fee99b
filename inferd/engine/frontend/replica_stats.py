"""The stats of several engine cores as one (data parallelism): counts and gauges add up, the KV
cache's usage is the fullest replica's, step timings pool every replica's steps."""

from __future__ import annotations

from inferd.engine_client import EngineStats
from inferd.kv_tier_stats import merge_tiers

_SUMMED = ("num_running", "num_waiting", "num_preemptions", "prefix_cache_queries",
           "prefix_cache_hits", "prompt_tokens", "generation_tokens", "steps", "num_queue_timeouts",
           "spec_decode_num_drafts", "spec_decode_num_draft_tokens",
           "spec_decode_num_accepted_tokens", "kv_blocks_saved", "kv_blocks_loaded",
           "kv_saves_dropped", "kv_lookups_late", "kv_transfers", "kv_transfer_bytes",
           "kv_transfer_seconds", "kv_transfer_blocks_recomputed")  # fmt: skip


def merge_stats(stats: list[EngineStats]) -> EngineStats:
    if len(stats) == 1:
        return stats[0]
    merged = {name: sum(getattr(s, name) for s in stats) for name in _SUMMED}
    merged["kv_cache_usage"] = max(s.kv_cache_usage for s in stats)
    timings = [s.step_timing for s in stats if s.step_timing is not None]
    timing = timings[0] if timings else None
    for other in timings[1:]:
        timing = timing.plus(other)
    merged["step_timing"] = timing
    counted = [s.step_efficiency for s in stats if s.step_efficiency is not None]
    merged["step_efficiency"] = counted[0] if counted else None
    for other in counted[1:]:
        merged["step_efficiency"] = merged["step_efficiency"].plus(other)
    width = max(len(s.spec_decode_num_accepted_tokens_per_pos) for s in stats)
    merged["spec_decode_num_accepted_tokens_per_pos"] = tuple(
        sum(s.spec_decode_num_accepted_tokens_per_pos[j]
            for s in stats if j < len(s.spec_decode_num_accepted_tokens_per_pos))
        for j in range(width)
    )  # fmt: skip
    # LoRA: an adapter is resident if some replica holds it; requests add up per adapter.
    merged["lora_resident"] = tuple(sorted({n for s in stats for n in s.lora_resident}))
    requests: dict[str, int] = {}
    for s in stats:
        for name, count in s.lora_requests.items():
            requests[name] = requests.get(name, 0) + count
    merged["lora_requests"] = requests
    merged["kv_tiers"] = merge_tiers([s.kv_tiers for s in stats])
    merged["sleep_level"] = max(s.sleep_level for s in stats)  # replicas sleep together
    merged["engine_role"] = "+".join(sorted({s.engine_role for s in stats if s.engine_role}))
    return EngineStats(**merged)  # NOTE: a field added to EngineStats needs its rule here
