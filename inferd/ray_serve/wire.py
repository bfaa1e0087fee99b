"""What crosses a Serve handle between the ingress and an engine replica: plain, picklable data.

    ingress ──EngineCall──▶ replica.generate()        (one streaming handle call per request)
    ingress ◀── Accepted | Refused, then RequestOutput... | Failed

The first item says whether the replica's engine took the request (`add_request`'s verdict),
so a bad request is still a 400 before anything streams. inferd's typed errors do not survive
pickling (their constructors take more than the message), so they cross as `ErrorData`.

Two things are rewritten on the way, both undone on arrival:
* Clocks: `RequestMetrics` holds `time.monotonic()` stamps of one machine. The call carries how
  long the request already waited instead of its arrival stamp, and the ingress shifts the
  replica's stamps onto its own clock by the offset seen at `Accepted`.
* Prompts: every `RequestOutput` (delta or cumulative) repeats the prompt (token ids, text, prompt
  logprobs); a replica sends them once and `PromptMemo` fills them back in.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

from inferd.engine_client import ModelInfo, PromptInput, TokenizerLike
from inferd.errors import ContextTooLong, EngineDeadError, InvalidRequest, Overloaded, RequestFailed
from inferd.outputs import RequestOutput
from inferd.sampling_params import SamplingParams

# The stamps of RequestMetrics; arrival_time is set from the ingress's own record.
_STAMPS = ("first_scheduled_time", "first_token_time", "last_token_time", "finished_time",
           "queued_time")  # fmt: skip


@dataclass
class EngineCall:
    """One engine request, as the ingress hands it to a replica."""

    request_id: str
    engine_prompt: PromptInput
    params: SamplingParams
    waited_s: float  # seconds since the server received the request
    # NOTE: set by inferd's request router (router.py) on this very object, in the ingress
    # process, once the request is routed: how it was routed. Never read by the replica.
    decision: str | None = None

    @property
    def token_ids(self) -> list[int] | None:
        p = self.engine_prompt
        if isinstance(p, dict):
            return p.get("prompt_token_ids")
        return list(p) if isinstance(p, list) else None

    @property
    def cache_salt(self) -> str | None:
        p = self.engine_prompt
        return p.get("cache_salt") if isinstance(p, dict) else None

    @property
    def prompt(self) -> str:
        """What Ray's PrefixCacheAffinityRouter matches on (it reads `.prompt` of an argument):
        the prompt's text, or its token ids as characters when the request gave only ids."""
        p = self.engine_prompt
        text = p if isinstance(p, str) else (p.get("prompt") if isinstance(p, dict) else None)
        if text:
            return text
        return "".join(chr(0x10000 + t) for t in self.token_ids or ())  # past the surrogates


@dataclass(frozen=True)
class ErrorData:
    kind: str  # the inferd error class it is (or derives from), or "internal"
    message: str
    param: str | None = None
    code: str | None = None  # OpenAI's machine-readable code, where the error has one

    @classmethod
    def of(cls, error: BaseException) -> ErrorData:
        # NOTE: subclasses (InvalidGrammarError, ...) cross as the class the server maps.
        for kind in (ContextTooLong, InvalidRequest):
            if isinstance(error, kind):
                return cls(kind.__name__, error.message, error.param, error.code)
        for kind in (Overloaded, EngineDeadError, RequestFailed):
            if isinstance(error, kind):
                return cls(kind.__name__, str(error))
        return cls("internal", f"{type(error).__name__}: {error}")

    def error(self) -> BaseException:
        """The typed error again (the server maps each type to its status code)."""
        if self.kind in ("ContextTooLong", "InvalidRequest"):
            error = (ContextTooLong if self.kind == "ContextTooLong" else InvalidRequest)(
                self.param, self.message
            )
            error.code = self.code
            return error
        simple = {"Overloaded": Overloaded, "EngineDeadError": EngineDeadError,
                  "RequestFailed": RequestFailed}  # fmt: skip
        return simple.get(self.kind, RuntimeError)(self.message)


@dataclass(frozen=True)
class Accepted:
    replica: str  # Serve's replica id
    node: str  # the Ray node it runs on
    clock: float  # the replica's time.monotonic() when it took the request


@dataclass(frozen=True)
class Refused:
    """The replica's engine did not take the request; nothing runs."""

    error: ErrorData


@dataclass(frozen=True)
class Failed:
    """The request failed after it started (its step raised, or the engine died)."""

    error: ErrorData


@dataclass(frozen=True)
class EngineFacts:
    """What the ingress needs to know about the engines beyond `EngineClient`: enough to build
    the same ServerSettings as `inferd serve` and to route by KV blocks."""

    model_config: Any  # inferd.config.ModelConfig (the architecture picks tool formats)
    max_num_seqs: int
    block_size: int
    num_kv_blocks: int
    max_bytes_per_token: int | None


@dataclass(frozen=True)
class ReplicaDescription:
    """A replica introduces the engines to the ingress (all replicas serve one model)."""

    model_info: ModelInfo
    tokenizer: TokenizerLike
    facts: EngineFacts
    replica: str
    node: str
    stats: Any  # inferd.engine_client.EngineStats: the describing replica's first report


@dataclass(frozen=True)
class ReplicaReport:
    """Pushed by each replica to the ingress every `report_interval_s`."""

    replica: str
    node: str
    health: str | None  # the engine client's health(): None when healthy
    stats: Any  # inferd.engine_client.EngineStats
    stopping: bool = False  # sent once when the replica shuts down


def shifted(out: RequestOutput, offset: float, arrival: float) -> RequestOutput:
    """`out` with its metrics on the ingress's clock (`offset` = ingress clock − replica clock)
    and the ingress's own arrival time."""
    m = out.metrics
    if m is None:
        return out
    moved: dict[str, Any] = {
        s: getattr(m, s) + offset for s in _STAMPS if getattr(m, s) is not None
    }
    moved["preemption_times"] = tuple(t + offset for t in m.preemption_times)
    out.metrics = dataclasses.replace(m, arrival_time=arrival, **moved)
    return out


def replica_arrival(waited_s: float) -> float:
    """The request's arrival on this machine's clock."""
    return time.monotonic() - max(0.0, waited_s)


@dataclass(frozen=True)
class _SentBefore:
    """Stands for "the prompt fields of this request's previous output" (an instance, not a
    sentinel object: identity does not survive pickling)."""


_SENT = _SentBefore()


class PromptMemo:
    """Replica side `thin`, ingress side `fill`: the prompt fields of a request's outputs go
    over the wire while they change (in practice, once)."""

    _FIELDS = ("prompt", "prompt_token_ids", "prompt_logprobs")

    def __init__(self) -> None:
        self._last: tuple[Any, ...] | None = None

    def thin(self, out: RequestOutput) -> RequestOutput:
        # NOTE: an EmbeddingRequestOutput has no prompt_logprobs, and only one output: it is
        # always sent whole.
        now = tuple(getattr(out, f, None) for f in self._FIELDS)
        if self._last is not None and all(
            a is b or a == b for a, b in zip(now, self._last, strict=True)
        ):
            return dataclasses.replace(out, **{f: _SENT for f in self._FIELDS})
        self._last = now
        return out

    def fill(self, out: RequestOutput) -> RequestOutput:
        if isinstance(out.prompt_token_ids, _SentBefore):
            if self._last is None:
                raise RuntimeError("a replica left out the prompt of a request's first output")
            for f, value in zip(self._FIELDS, self._last, strict=True):
                setattr(out, f, value)
        else:
            self._last = tuple(getattr(out, f, None) for f in self._FIELDS)
        return out
