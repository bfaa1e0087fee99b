"""The errors inferd raises on purpose, by kind, so that each boundary can answer in its own terms:
the CLI prints the message (no traceback) and exits non-zero; the HTTP server maps each type to
a status code and an OpenAI-shaped body (`inferd/server/http/errors.py`). Anything else that escapes
is a bug: the server answers 500 with an id and logs the traceback once.

    InvalidRequest (ValueError)   400  the client sent something unusable; `param` names the field
      ContextTooLong              400  prompt (+ max_tokens) does not fit max_model_len
    Overloaded                    503  too many requests waiting; retry later
      QueueTimeout                503  waited past --max-queue-time without being scheduled
    ModelAsleep                   503  the model sleeps (POST /sleep); POST /wake_up first
    RequestsRunning               409  a sleep was asked for while requests run
    EngineDeadError               503  the engine can run no more steps
    RequestFailed                 500  the engine failed this one request (its step raised)
    ModelLoadError (ValueError)   -    the model cannot be used (start-up, CLI)
"""

from __future__ import annotations


class InvalidRequest(ValueError):
    """A request (or a SamplingParams) the engine refuses. `param` is the request field the
    message is about (OpenAI's `param`), None when no single field is to blame."""

    code: str | None = None  # OpenAI's machine-readable `code`, where one applies

    def __init__(self, param: str | None, message: str):
        super().__init__(message)
        self.param = param
        self.message = message


class ContextTooLong(InvalidRequest):
    """The prompt, or the prompt plus the requested completion, exceeds max_model_len."""

    code = "context_length_exceeded"


class Overloaded(RuntimeError):
    """The server's queue is full (`max_queued_requests`); the client should retry later."""

    code = "queue_full"
    retry_after_s = 1


class QueueTimeout(Overloaded):
    """The request waited `max_queue_time` without being scheduled and was dropped from the
    queue (finish reason "queue_timeout"); the client should retry later."""

    code = "queue_timeout"


QUEUE_TIMEOUT = "queue_timeout"  # the finish reason of a request dropped from the queue


class ModelAsleep(RuntimeError):
    """The engine was put to sleep (POST /sleep: its KV pool, maybe its weights, are freed) and
    can run nothing until woken (POST /wake_up, or a server started with --wake-on-request)."""

    code = "model_asleep"


class RequestsRunning(RuntimeError):
    """A sleep was asked for while requests run: refused, the requests go on untouched (the
    pool they use is what a sleep frees). Retry once they have finished."""

    code = "requests_running"


class EngineDeadError(RuntimeError):
    """The engine cannot run any more steps (e.g. a tensor-parallel worker died); every request
    in flight has failed and new ones are refused."""

    code = "engine_unavailable"


class RequestFailed(RuntimeError):
    """The engine failed this request (its step raised); other requests are unaffected."""

    code = "engine_error"


class ModelLoadError(ValueError):
    """The model path, file or checkpoint cannot be used: missing, malformed, unsupported."""
