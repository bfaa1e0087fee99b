"""What `/infill` takes from llama.cpp beyond the prompt: the sampler chain (`samplers`), the
stop rules code-completion plugins rely on (`n_indent`, `t_max_predict_ms`) and the answer's
field filter (`response_fields`). Each is honoured as llama.cpp's server defines it, or refused
where inferd cannot reproduce it (docs/server.md, "Fill-in-the-middle").

The sampler chain. llama.cpp applies exactly the samplers listed, in the listed order, then
draws; a sampler left out is not applied, whatever its parameter says. inferd's order is fixed
(inferd/engine/sampling/sampler.py): penalties, temperature, top_k, top_p, min_p, draw. A chain
is honoured when it means the same thing as that order at the request's values:

- a sampler that does nothing at the request's values (top_k 0, top_p 1, min_p 0,
  temperature 1, neutral penalties) can sit anywhere;
- temperature and top_k commute (a temperature > 0 keeps the ranking top_k reads), and at
  temperature 0 both sides take the argmax, which every filter keeps;
- `dry`, `xtc`, `typ_p` and `top_n_sigma` do nothing at llama.cpp's default parameters, and
  inferd refuses the fields that would change those (`dry_multiplier`, `xtc_probability`, ...),
  so naming them changes nothing;
- a parameter set away from its neutral value whose sampler the chain leaves out is refused:
  llama.cpp would drop it, and dropping a field the client sent is not honouring it.

`infill` (llama.cpp's fill-in-the-middle filter, engine/sampling/infill_sampler.py) runs after
top_k, top_p and min_p in inferd's order, so it must come after those the request sets; the
filter itself needs top_k (SamplingParams refuses it without).
"""

from __future__ import annotations

from typing import Any

from inferd.errors import InvalidRequest
from inferd.sampling_params import SamplingParams

# inferd's fixed order (sampler.py); the rank of each llama.cpp name that maps onto a stage.
_RANK = {"penalties": 0, "temperature": 1, "top_k": 2, "top_p": 3, "min_p": 4, "infill": 5}
# llama.cpp samplers that pass everything through at their default parameters, which inferd
# keeps (it declares none of the fields that set them).
_NO_OP = ("dry", "xtc", "typ_p", "top_n_sigma")
KNOWN = (*_RANK, *_NO_OP)


def _active(params: SamplingParams) -> dict[str, str]:
    """The stages that change the distribution at these values → how to name the value."""
    active: dict[str, str] = {}
    penalties = (
        params.repetition_penalty != 1.0
        or params.presence_penalty != 0.0
        or params.frequency_penalty != 0.0
    )
    if penalties:
        active["penalties"] = "repetition_penalty / presence_penalty / frequency_penalty"
    if params.temperature != 1.0:
        active["temperature"] = f"temperature {params.temperature:g}"
    if params.temperature >= 1e-5:  # greedy (sampler.py's threshold): the filters are moot
        if 0 < params.top_k:
            active["top_k"] = f"top_k {params.top_k}"
        if params.top_p < 1.0:
            active["top_p"] = f"top_p {params.top_p:g}"
        if params.min_p > 0.0:
            active["min_p"] = f"min_p {params.min_p:g}"
    return active


def check_samplers(samplers: list[str] | None, params: SamplingParams, samples: bool) -> None:
    """Refuse a chain inferd cannot reproduce (see the module's docstring). `samples`: False
    when nothing will be sampled (n_predict 0), where only the names are checked."""
    if samplers is None:
        return  # no chain given: inferd's own order, as on every other route
    for name in samplers:
        if name not in KNOWN:
            raise InvalidRequest(
                "samplers", f"samplers: unknown sampler {name!r}; known: {', '.join(KNOWN)}"
            )
    if not samples:
        return
    active = _active(params)
    if "infill" in samplers:
        active["infill"] = "the infill sampler"
    for stage, value in active.items():
        if stage not in samplers:
            raise InvalidRequest(
                "samplers",
                f"samplers leaves out {stage!r}, so llama.cpp would not apply {value}: add "
                f"{stage!r} to samplers or leave the value at its default",
            )
    chain = [name for name in samplers if name in active]
    for i, first in enumerate(chain):
        for later in chain[i + 1 :]:
            if {first, later} == {"temperature", "top_k"}:
                continue  # they commute (module docstring)
            if _RANK[first] > _RANK[later]:
                raise InvalidRequest(
                    "samplers",
                    f"samplers applies {first!r} before {later!r}; inferd's order is fixed "
                    f"(penalties, temperature, top_k, top_p, min_p, infill) and at "
                    f"{active[first]} and {active[later]} the two orders sample differently: "
                    "list them in that order",
                )


def indent_cut(text: str, start: int, n_indent: int) -> int | None:
    """llama.cpp's `n_indent` rule: every line after the first must start with at least
    `n_indent` spaces or tabs before its first other character (a line break counts: an empty
    line ends it too). The offset where `text` is cut (before that character), or None.
    `start`: where the lines not yet checked begin (a check resumes there)."""
    if n_indent <= 0:
        return None
    pos = text.find("\n", start)
    while pos != -1:
        i = pos + 1
        while i < len(text) and text[i] in " \t":
            i += 1
        if i == len(text):
            return None  # the line's indentation is not known yet
        if i - pos - 1 < n_indent:
            return i
        pos = text.find("\n", pos + 1)
    return None


def indent_resume(text: str) -> int:
    """Where the next `indent_cut` must start: the last line break, whose line may still grow."""
    return max(text.rfind("\n"), 0)


def pick_fields(answer: dict[str, Any], fields: list[str]) -> dict[str, Any]:
    """llama.cpp's `response_fields`: a flat object keyed by each path as written
    ("timings/prompt_n" → answer["timings"]["prompt_n"]); a path that names nothing is left out,
    and an empty list keeps the whole answer."""
    if not fields:
        return answer
    picked: dict[str, Any] = {}
    for path in fields:
        value: Any = answer
        for key in path.split("/"):
            if not isinstance(value, dict) or key not in value:
                break
            value = value[key]
        else:
            picked[path] = value
    return picked
