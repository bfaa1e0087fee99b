"""Where a disaggregated request's prompt is computed (client.py asks; pure, so the unit tests
run it without engines).

    direct       the decode engine computes the prompt itself: a short prompt (below
                 --disaggregate-min-prompt, where the hand-over would cost more than it saves),
                 a prompt whose every full block the decode engine already holds (nothing to
                 move), a request that needs its prompt's logprobs or is an embedding (its
                 prompt must be computed where it is answered), or no prefill engine alive
    prefill i    the least loaded live prefill engine (the lowest index on ties)

The decode engine itself is chosen by the data-parallel router's prefix affinity with its load
bound (engine/frontend/dp_router.py `choose_holding`), which also says how many leading blocks
of the prompt that engine holds.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_MIN_PROMPT = 256  # tokens (--disaggregate-min-prompt); docs/distributed.md says why


@dataclass(frozen=True)
class PromptRoute:
    prefill: int | None  # the prefill engine's index; None: the decode engine computes it
    reason: str  # why (logs, tests): "prefill", "short", "cached", "needs-prompt", "no-prefill"


def handed_blocks(prompt_len: int, block_size: int) -> int:
    """The full blocks a decode engine can take from a prefill engine: every full block but
    one that ends the prompt (the last prompt token is always computed where it is sampled)."""
    return max(0, prompt_len - 1) // block_size


def route_prompt(prompt_len: int, block_size: int, decode_holds: int, min_prompt: int,
                 prefill_loads: list[int | None], needs_prompt: bool) -> PromptRoute:  # fmt: skip
    """`decode_holds`: leading blocks of the prompt the chosen decode engine holds;
    `prefill_loads`: each prefill engine's unfinished requests, None for a dead one."""
    if needs_prompt:
        return PromptRoute(None, "needs-prompt")
    if prompt_len < min_prompt:
        return PromptRoute(None, "short")
    if decode_holds >= handed_blocks(prompt_len, block_size):
        return PromptRoute(None, "cached")
    live = [i for i, n in enumerate(prefill_loads) if n is not None]
    if not live:
        return PromptRoute(None, "no-prefill")
    return PromptRoute(min(live, key=lambda i: (prefill_loads[i], i)), "prefill")
