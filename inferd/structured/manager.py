"""Compiling structured-output specs off the engine thread, once per distinct spec.

The engine (or the server, to answer a bad spec with 400 before streaming) calls
`submit(spec)`, which returns at once with a handle (a `concurrent.futures.Future`). A worker
thread compiles the grammar; llguidance releases the GIL while it does, so the engine loop keeps
stepping other requests. The scheduler leaves a constrained request waiting until
`is_ready(handle)`, then calls `matcher(handle)` once per sequence: a fresh GrammarMatcher, or the
spec's InvalidGrammarError, raised for that request alone.

Compiled grammars are cached by `spec.key` (kind + canonical spec text + options) in a bounded LRU
of pristine matchers, which are copied per sequence (a copy costs microseconds, compiling a JSON
schema about a millisecond, a large grammar far more). A spec being compiled is not compiled
twice: a second submit gets the same future. Failures are cached too, since they are
deterministic.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import llguidance

from inferd.structured.grammar import compile_matcher
from inferd.structured.matcher import GrammarMatcher
from inferd.structured.tokenizer_info import TokenizerInfo
from inferd.structured_params import StructuredOutputsParams

GrammarHandle = Future  # of a pristine llguidance.LLMatcher


class GrammarManager:
    """`info` may be a callable that builds the TokenizerInfo: it then runs on the first
    compilation, in a worker thread (a second or so: not on the engine loop, and not at all for
    an engine that never sees a constrained request)."""

    def __init__(
        self,
        info: TokenizerInfo | Callable[[], TokenizerInfo],
        *,
        max_workers: int = 1,
        cache_size: int = 256,
    ):
        if max_workers < 1 or cache_size < 1:
            raise ValueError("max_workers and cache_size must be >= 1")
        self._info = info if isinstance(info, TokenizerInfo) else None
        self._info_factory = None if isinstance(info, TokenizerInfo) else info
        self._info_lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers, thread_name_prefix="inferd-grammar")
        self._lock = threading.Lock()
        self._cache: OrderedDict[tuple[str, str], GrammarHandle] = OrderedDict()
        self._cache_size = cache_size

    def submit(self, spec: StructuredOutputsParams) -> GrammarHandle:
        """Start compiling `spec` (or reuse its cached / in-flight compilation); never blocks."""
        key = spec.key
        with self._lock:
            handle = self._cache.get(key)
            if handle is not None:
                self._cache.move_to_end(key)
                return handle
            handle = self._pool.submit(self._compile, spec)
            self._cache[key] = handle
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)  # in-flight futures still complete for holders
            return handle

    @property
    def info(self) -> TokenizerInfo:
        """The TokenizerInfo (built now, on this thread, if no compilation has built it yet)."""
        if self._info is None:
            with self._info_lock:
                if self._info is None:
                    self._info = self._info_factory()
        return self._info

    def _compile(self, spec: StructuredOutputsParams) -> llguidance.LLMatcher:
        return compile_matcher(spec, self.info)

    @staticmethod
    def is_ready(handle: GrammarHandle) -> bool:
        """Compiled (or failed): `matcher(handle)` will not block."""
        return handle.done()

    def matcher(self, handle: GrammarHandle, timeout: float | None = None) -> GrammarMatcher:
        """A fresh matcher for one sequence (blocks until compiled). Raises the spec's
        InvalidGrammarError, or TimeoutError after `timeout` seconds."""
        pristine: llguidance.LLMatcher = handle.result(timeout)
        return GrammarMatcher(pristine.deep_copy(), self.info)

    def compile(
        self, spec: StructuredOutputsParams, timeout: float | None = None
    ) -> GrammarMatcher:
        """submit + matcher: a blocking one-off (the offline API, tests, up-front validation)."""
        return self.matcher(self.submit(spec), timeout)

    def shutdown(self) -> None:
        """Stop the worker threads (compilations in progress finish first)."""
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> GrammarManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
