"""The messages between the front end and an engine core in its own process, and their wire
format: msgpack through msgspec; commands over a ZeroMQ socket on a Unix-domain path (`ipc://`)
in a directory only this user can open, the core's messages back over an OS pipe.

    front end ──PUSH──▶ core:  Add, Abort, Finish, Call, Stop
    front end ◀──pipe── core:  Ready or StartFailed (once), Outputs (after each step with news),
                               CallResult

Why these: a step's outputs for 32 requests encode and decode in tens of microseconds with
msgspec (a few times faster than pickle, and typed: a message decodes into these classes or
fails). Commands are few and may come from any thread of the front end, and ZeroMQ queues
them without blocking it. Outputs come every step, and ZeroMQ's I/O threads would add two
thread wake-ups to each (one per side): the core's loop writes them to a pipe itself, buffering
what the pipe cannot take yet so that it never blocks on a slow reader (frame_pipe.py), and the
front end's event loop reads them there (docs/engine.md has the measurement,
scripts/ipc_bench.py reproduces it). Every payload is plain data (engine/core/core_output.py); no
object of either side crosses.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import msgspec

from inferd.engine.core.core_output import CoreOutput, CoreRequest, SampleFinish
from inferd.engine_client import EngineStats, ModelInfo, ProfilerStateError
from inferd.errors import (
    ContextTooLong,
    EngineDeadError,
    InvalidRequest,
    ModelAsleep,
    ModelLoadError,
    RequestsRunning,
)

# ---- front end → core ------------------------------------------------------------------------


class Add(msgspec.Struct, tag=True):
    request: CoreRequest


class Abort(msgspec.Struct, tag=True):
    request_ids: list[str]


class Finish(msgspec.Struct, tag=True):
    """Samples a stop string ended (the front end saw it)."""

    samples: list[SampleFinish]


class Call(msgspec.Struct, tag=True):
    """Run a method of the core between steps (profiling, rank reports); answered by a
    CallResult with the same id."""

    call_id: int
    method: str
    args: list[Any] = []


class Stop(msgspec.Struct, tag=True):
    pass


ToCore = Add | Abort | Finish | Call | Stop

# ---- core → front end ------------------------------------------------------------------------


class Ready(msgspec.Struct, tag=True):
    """The core loaded its model: what the front end needs to know of it."""

    model_info: ModelInfo
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    hash_root: bytes  # the prefix cache's hash salt (the data-parallel router hashes alike)
    block_size: int
    num_blocks: int  # in the full-attention pool: how many blocks a replica can cache
    pid: int


class StartFailed(msgspec.Struct, tag=True):
    error_type: str
    message: str


class AddAck(msgspec.Struct):
    request_id: str
    error_type: str | None = None  # None: queued
    param: str | None = None
    message: str = ""


class Failure(msgspec.Struct):  # a request in flight when a step raised (core_loop.py)
    request_id: str
    message: str


class Outputs(msgspec.Struct, tag=True):
    outputs: list[CoreOutput]
    acks: list[AddAck] = []
    stats: EngineStats | None = None
    # Seconds after the last message a busy core may stay silent and still be healthy (a
    # margin over its slowest recent step: engine/core/stall_bound.py).
    stall_bound: float = 0.0
    failed: list[Failure] = []


class CallResult(msgspec.Struct, tag=True):
    call_id: int
    result: Any = None
    error_type: str | None = None
    message: str = ""


FromCore = Ready | StartFailed | Outputs | CallResult

_encoder = msgspec.msgpack.Encoder()
_to_core = msgspec.msgpack.Decoder(ToCore)
_from_core = msgspec.msgpack.Decoder(FromCore)


def encode(message: ToCore | FromCore) -> bytes:
    return _encoder.encode(message)


def decode_to_core(data: bytes) -> ToCore:
    return _to_core.decode(data)


def decode_from_core(data: bytes) -> FromCore:
    return _from_core.decode(data)


# Errors that cross by type (a core-side refusal must reach the caller as what it is).
_ERRORS: dict[str, type[Exception]] = {e.__name__: e for e in (
    InvalidRequest, ContextTooLong, EngineDeadError, ProfilerStateError, ModelLoadError,
    ModelAsleep, RequestsRunning, ValueError, RuntimeError)}  # fmt: skip


def describe_error(error: BaseException) -> tuple[str, str | None, str]:
    """(type name, param, message) of an error, for the other side to raise again: the
    nearest type it knows (an InvalidGrammarError crosses as the InvalidRequest it is)."""
    known = next((k.__name__ for k in type(error).__mro__ if k.__name__ in _ERRORS),
                 type(error).__name__)  # fmt: skip
    return known, getattr(error, "param", None), str(error)


def rebuild_error(error_type: str, param: str | None, message: str) -> Exception:
    kind = _ERRORS.get(error_type)
    if kind is None:
        return RuntimeError(f"{error_type}: {message}")
    if issubclass(kind, InvalidRequest):
        return kind(param, message)
    return kind(message)


class SocketDir:
    """A private directory for one core's command socket path (mode 0700: no other user can
    connect), removed with `close`."""

    def __init__(self) -> None:
        self.path = Path(tempfile.mkdtemp(prefix="inferd-core-"))
        self.to_core = f"ipc://{self.path / 'in'}"

    def close(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
