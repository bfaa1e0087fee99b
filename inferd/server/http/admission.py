"""Admission control: what one request may ask for and what the server holds, decided on the
event loop from counters the server keeps itself, before any tokenization and without waiting
for an engine step.

Per request (400, it could never be served): the number of prompts; a text prompt whose bytes
already exceed what `max_model_len` tokens can hold (bytes bound the token count: a token stands
for at most `max_bytes_per_token` bytes of text, so the prompt needs more than
`bytes / max_bytes_per_token` tokens); a token-id prompt longer than the context; more prompt
tokens than the whole queue may hold.

What the server holds (503 with Retry-After, the request could be served later):
  * queued requests: an engine request (one prompt) is queued from its admission until its
    first output arrives, i.e. until the engine scheduled it and computed its prompt, or until
    it ends. It counts once, whichever stage it is in (tokenizing, waiting for its grammar,
    handed to the engine thread, waiting in the scheduler). Each of its `n` samples is a
    sequence that takes a seat (a sequence slot, `max_num_seqs`), so a queued request counts
    `n` times towards `--max-queued-requests`, as vLLM fans `n` out into `n` requests. Requests
    that have produced output hold their `n` seats until they finish, and only queued samples
    beyond the free seats are *waiting*: an idle server with 64 free seats admits 64
    simultaneous single-sample requests whatever `--max-queued-requests` says.
  * queued prompt tokens (`--max-queued-tokens`): the prefill backlog. Before tokenizing, a
    text prompt counts with the least number of tokens its bytes allow; after tokenizing, with
    its exact count (checked again then). A prompt cut by `truncate_prompt_tokens` counts with
    what is kept, and is not too long for the context whatever its length.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from inferd.errors import ContextTooLong, InvalidRequest, Overloaded
from inferd.server.http.errors import SERVER_ERROR, APIError


@dataclass(frozen=True)
class AdmissionLimits:
    max_model_len: int
    seats: int = 1  # the engine's max_num_seqs: sequences that run at once
    max_queued_requests: int | None = None  # engine requests waiting for a seat
    max_queued_tokens: int | None = None  # prompt tokens of queued requests
    max_prompts_per_request: int = 256
    max_bytes_per_token: int | None = None  # None: the tokenizer gives no byte bound
    retry_after_s: int = 1


class ShuttingDown(APIError):
    def __init__(self, message: str = "the server is shutting down; retry on another replica"):
        super().__init__(503, message, SERVER_ERROR, code="shutting_down",
                         headers={"Retry-After": "1"})  # fmt: skip


def text_bytes(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def all_text(value: Any) -> str:
    """Every string in a JSON-like value (chat messages), joined: what the prompt is made of."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        return "".join(all_text(v) for v in value.values())
    if isinstance(value, list | tuple):
        return "".join(all_text(v) for v in value)
    return ""


class Admission:
    """The server's counters. Event loop only (no locks): every method is synchronous."""

    def __init__(self, limits: AdmissionLimits):
        self.limits = limits
        self.queued_requests = 0
        self.queued_samples = 0  # the queued requests' sequences: n each
        self.queued_tokens = 0
        self.seated = 0  # seats held by requests that have produced output
        self.draining = False
        self.live: set[Reservation] = set()

    # ---- per request (400) -------------------------------------------------------------------
    def least_tokens(self, prompt: str | list[int]) -> int:
        """The fewest tokens `prompt` can take (exact for token ids)."""
        if not isinstance(prompt, str):
            return len(prompt)
        per_token = self.limits.max_bytes_per_token
        return max(1, math.ceil(text_bytes(prompt) / per_token)) if per_token else 1

    def check_request(
        self, prompts: list[Any], param: str = "prompt", keep: int | None = None
    ) -> list[int]:
        """The least token count of each prompt (of its last `keep` tokens, when the request
        truncates its prompts: -1 keeps max_model_len); raises for a request that can never be
        served. Costs one pass over the prompts' lengths, no tokenization."""
        limits = self.limits
        if len(prompts) > limits.max_prompts_per_request:
            raise InvalidRequest(
                param,
                f"{param}: {len(prompts)} prompts in one request; the limit is "
                f"{limits.max_prompts_per_request} (--max-prompts-per-request)",
            )
        least = [self.least_tokens(p) for p in prompts]
        if keep is not None:  # truncated to fit: the engine checks what is kept
            kept = limits.max_model_len if keep == -1 else max(1, keep)
            least = [min(count, kept) for count in least]
        for i, (prompt, count) in enumerate(zip(prompts, least, strict=True)):
            if count < limits.max_model_len or keep is not None:
                continue
            where = f"{param}[{i}]" if len(prompts) > 1 else param
            if isinstance(prompt, str):
                size = f"{text_bytes(prompt)} bytes of text (at least {count} tokens)"
            else:
                size = f"{count} tokens"
            raise ContextTooLong(
                param,
                f"{where} has {size}, but max_model_len is {limits.max_model_len}: "
                "no room is left to generate",
            )
        self._check_tokens(sum(least), param)
        return least

    def _check_tokens(self, tokens: int, param: str) -> None:
        limit = self.limits.max_queued_tokens
        if limit is not None and tokens > limit:
            raise InvalidRequest(
                param,
                f"{param}: the request's prompts hold at least {tokens} tokens, more than the "
                f"server queues at once ({limit}, --max-queued-tokens)",
            )

    # ---- what the server holds (503) ---------------------------------------------------------
    def waiting(self, extra_samples: int = 0) -> int:
        """Queued samples beyond the free seats: those that would wait for one."""
        free = max(0, self.limits.seats - self.seated)
        return max(0, self.queued_samples + extra_samples - free)

    def _check_room(self, prompts: int, n: int, tokens: int, param: str = "prompt") -> None:
        if self.draining:
            raise ShuttingDown()
        limits = self.limits
        limit = limits.max_queued_requests
        samples = prompts * n
        if limit is not None and samples and self.waiting(samples) > limit:
            if samples > limit + limits.seats:
                what = f"{prompts} prompts" if n == 1 else f"{prompts} prompt(s) × n={n}"
                raise InvalidRequest(
                    param if n == 1 else "n",
                    f"{param if n == 1 else 'n'}: {what} in one request ask for {samples} "
                    f"sequences; the server runs {limits.seats} and queues {limit} at once "
                    "(--max-num-seqs, --max-queued-requests)",
                )
            raise self._overloaded(f"the server's queue is full ({limit} requests waiting)")
        token_limit = limits.max_queued_tokens
        if token_limit is not None and tokens and self.queued_tokens + tokens > token_limit:
            raise self._overloaded(
                f"the server's queue is full ({self.queued_tokens} prompt tokens queued, "
                f"limit {token_limit})"
            )

    def _overloaded(self, message: str) -> Overloaded:
        error = Overloaded(message)
        error.retry_after_s = self.limits.retry_after_s
        return error

    def admit(
        self, prompts: list[Any], n: int, param: str = "prompt", keep: int | None = None
    ) -> Reservation:
        """Check the request (`n` samples of each prompt; `keep`: its truncate_prompt_tokens)
        and reserve its place in the queue; raises InvalidRequest (400), Overloaded or
        ShuttingDown (503)."""
        least = self.check_request(prompts, param, keep)
        self._check_room(len(prompts), n, sum(least), param)
        return Reservation(self, least, n)


class Reservation:
    """One HTTP request's place: its engine requests, queued until each has produced output."""

    def __init__(self, admission: Admission, tokens: list[int], n: int):
        self.admission = admission
        self.n = n
        self.tokens = list(tokens)  # per prompt: the estimate, then the exact count
        self.queued = [True] * len(tokens)
        self.seated = [False] * len(tokens)
        self.index: dict[str, int] = {}  # engine request id → prompt index
        self.group: Any = None  # the RequestGroup serving it, for the drain
        admission.queued_requests += len(tokens)
        admission.queued_samples += len(tokens) * n
        admission.queued_tokens += sum(tokens)
        admission.live.add(self)

    def tokenized(self, counts: list[int], param: str = "prompt") -> None:
        """Replace the estimates with the exact counts; raises if the queue has no room for
        them now (the request's own estimate was already admitted)."""
        admission = self.admission
        grown = sum(counts) - sum(self.tokens)
        admission._check_tokens(sum(counts), param)
        if grown > 0:
            admission._check_room(0, self.n, grown, param)
        admission.queued_tokens += grown
        self.tokens = list(counts)

    def bind(self, request_ids: list[str]) -> None:
        self.index = {rid: i for i, rid in enumerate(request_ids)}

    def started(self, request_id: str) -> None:
        """The request's first output: it leaves the queue and holds its seats."""
        i = self.index.get(request_id)
        if i is None or not self.queued[i]:
            return
        self._unqueue(i)
        self.seated[i] = True
        self.admission.seated += self.n

    def finished(self, request_id: str) -> None:
        i = self.index.get(request_id)
        if i is not None:
            self._free(i)

    def release(self) -> None:
        """Everything still counted (the HTTP request ended, however it ended)."""
        for i in range(len(self.tokens)):
            self._free(i)
        self.admission.live.discard(self)

    def _unqueue(self, i: int) -> None:
        if self.queued[i]:
            self.queued[i] = False
            self.admission.queued_requests -= 1
            self.admission.queued_samples -= self.n
            self.admission.queued_tokens -= self.tokens[i]

    def _free(self, i: int) -> None:
        self._unqueue(i)
        if self.seated[i]:
            self.seated[i] = False
            self.admission.seated -= self.n
