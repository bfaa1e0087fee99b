"""The one step loop (`CoreLoop.run`): an engine core's commands in, its steps' news out. It runs
in the core's own process (`core_main`) or in a thread (core_thread.py); only the transport differs.

    front end ──Add/Abort/Finish/Call/Stop──▶ [take every waiting message] ─▶ core.step()
    front end ◀──────────── Outputs (news, add acks, stats) ◀───────────────┘

The loop takes messages only between steps and never waits on the front end: with work it only
looks at what already arrived, hands its outputs to the transport without blocking (a core
process's pipe buffers what it cannot take yet: frame_pipe.py), and steps again; without work it
sleeps on its inbox. An add is acknowledged once queued, or refused (InvalidRequest) with nothing
queued; a constrained request is queued once its grammar compiled (here, and only here), so a bad
spec is refused before anything streams, and the other requests step meanwhile. A step that
raises fails the requests in flight (`Outputs.failed`) and the loop serves on; an
EngineDeadError, or anything that is not an Exception, ends the loop.

Signals (core process): the core ignores SIGINT and SIGTERM. Its front end decides when it ends
(a drain lets the requests in flight finish first; a Ctrl-C in a terminal reaches every process
of the group). It dies with its front end (PR_SET_PDEATHSIG on Linux, and a check of its parent
while idle).
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import time
from multiprocessing.connection import Connection
from typing import Any

from inferd.engine.core.dashboard_view import SnapshotBuilder
from inferd.engine.core.stall_bound import StallBound
from inferd.engine.transport import ipc
from inferd.engine.transport.frame_pipe import FrameWriter
from inferd.errors import EngineDeadError
from inferd.memory_trim import malloc_trim

log = logging.getLogger(__name__)

IDLE_POLL_S = 1.0  # while idle: how often a core process looks at its parent
STUCK_POLL_S = 0.005  # steps scheduled nothing although requests exist: wait before trying again
STATS_EVERY_S = 0.05  # stats ride on outputs at most this often (and with every finish)
DRAIN_AT_EXIT_S = 2.0  # how long an ending core waits for the front end to read what it sent


class SocketTransport:
    """The core process's transport: commands from a ZeroMQ socket, messages into a pipe."""

    idle_wait_s = IDLE_POLL_S

    def __init__(self, inbox, outbox: FrameWriter, parent_pid: int):
        self.inbox, self.outbox, self.parent_pid = inbox, outbox, parent_pid

    def wait(self, timeout: float | None) -> bool:
        """Also wakes when the pipe can take more of what it holds back."""
        import zmq

        ms = None if timeout is None else int(timeout * 1000)
        if not self.outbox.pending:
            return bool(self.inbox.poll(ms, zmq.POLLIN))
        poller = zmq.Poller()
        poller.register(self.inbox, zmq.POLLIN)
        poller.register(self.outbox.fd, zmq.POLLOUT)
        ready = dict(poller.poll(ms))
        self.outbox.flush()
        return self.inbox in ready

    def take(self) -> list[Any]:
        import zmq

        messages = []
        while True:
            try:
                messages.append(ipc.decode_to_core(self.inbox.recv(zmq.NOBLOCK)))
            except zmq.Again:
                return messages

    def send(self, message: Any) -> None:
        self.outbox.send(ipc.encode(message))

    def front_end_gone(self, busy: bool) -> bool:
        return self.outbox.broken or (not busy and os.getppid() != self.parent_pid)


def _die_with_parent() -> None:
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: the idle check of the parent remains


def core_main(config, to_core: str, from_core: Connection, parent_pid: int,
              stall_timeout: float, log_levels: dict[str, int]) -> None:  # fmt: skip
    """The core process's entry (multiprocessing, spawn). `from_core`: the write end of the pipe
    to the front end (frame_pipe.py). `log_levels`: logger name → level, as the front end has
    them (the root's, inferd's, its progress lines': `--quiet` reaches here)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _die_with_parent()
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s")
    for name, level in log_levels.items():
        logging.getLogger(name).setLevel(level)
    import zmq

    context = zmq.Context()
    inbox = context.socket(zmq.PULL)
    inbox.connect(to_core)
    outbox = FrameWriter(os.dup(from_core.fileno()))  # never blocks the loop on a slow reader
    from_core.close()
    # NOTE: as the commands do (commands/startup_gc.py): no cyclic collections while start-up
    # makes millions of long-lived objects, then those frozen out of the collector's sight.
    gc.disable()
    core = None
    try:
        from inferd.engine.core.core import EngineCore

        core = EngineCore(config, owner_pid=parent_pid)  # its RAM KV tier is the server's
        gc.freeze()
        gc.enable()
        setup = core.setup
        outbox.send(ipc.encode(ipc.Ready(core.model_info, core.max_model_len, setup.max_num_seqs,
                                         setup.max_num_batched_tokens, core.hash_root,
                                         config.block_size, setup.kv_plan.num_blocks[0],
                                         os.getpid())))  # fmt: skip
        CoreLoop(core, SocketTransport(inbox, outbox, parent_pid), stall_timeout).run()
    except BaseException as e:  # noqa: BLE001 - failed to start: the front end says why, exits
        if core is not None:
            raise
        kind, _, message = ipc.describe_error(e)
        log.debug("engine core failed to start", exc_info=True)
        outbox.send(ipc.encode(ipc.StartFailed(kind, message)))
    finally:
        if core is not None:
            core.shutdown()
        outbox.drain(DRAIN_AT_EXIT_S)
        outbox.close()
        inbox.close()
        context.term()


class CoreLoop:
    """Drives one core (an `EngineCore`, or in-process anything with its request and step
    methods) from one thread; nothing else touches the core meanwhile. The transport:
    `wait(timeout)` for a command (True once one is there), `take()` what arrived, `send(message)`
    without blocking, `front_end_gone(busy)`, `idle_wait_s` (None: an idle loop sleeps until a
    command comes)."""

    def __init__(self, core, transport, stall_timeout: float):
        self.core, self.transport = core, transport
        step_tokens = getattr(getattr(core, "setup", None), "max_num_batched_tokens", 0)
        self.stall = StallBound(stall_timeout, step_tokens or 0)  # 0: learned from the steps
        self.acks: list[ipc.AddAck] = []
        # Constrained adds waiting for their grammar: request id → (request, its compilation).
        self.pending: dict[str, tuple[Any, Any]] = {}
        self.active: set[str] = set()  # requests added and not finished: failed if a step raises
        self.stopping = False
        self.snapshots = SnapshotBuilder()  # the dashboard's, built only when asked
        self._trim = malloc_trim()
        self._worked = False  # since the last trim
        self._stats = None  # the latest snapshot (EngineStats)
        self._stats_at = 0.0  # when stats were last sent
        self._stuck = False

    def run(self) -> None:
        """The step loop (the only one): until a Stop, or the front end is gone."""
        while not self.stopping:
            busy = self.core.has_unfinished_requests()
            if busy and not self._stuck:
                timeout = 0.0
            elif busy or self.pending:
                timeout = STUCK_POLL_S
            else:
                timeout = self.transport.idle_wait_s
                if self._worked and self._trim is not None:  # going idle: hand pages back
                    self._trim(0)
                    self._worked = False
            if self.transport.wait(timeout):
                for message in self.transport.take():
                    if not self.stopping:
                        self._handle(message)
                if self.stopping:
                    return
            elif self.transport.front_end_gone(busy):
                log.warning("the front end is gone: the engine core stops")
                return
            self._admit_compiled()
            if self.core.has_unfinished_requests():
                self._step()
                self._worked = True
            elif self.acks:
                self._send_outputs([], self.core.stats())

    def _handle(self, message) -> None:
        core = self.core
        if isinstance(message, ipc.Add):
            grammar = core.compile_grammar(message.request.params)
            if grammar is not None and not grammar.done():
                self.pending[message.request.request_id] = (message.request, grammar)
            else:
                self._add(message.request)
        elif isinstance(message, ipc.Abort):
            for request_id in message.request_ids:
                if self.pending.pop(request_id, None) is None:
                    self._abort(request_id)
                else:  # NOTE: answered as refused: the caller gave up on it (its abort came first)
                    self.acks.append(ipc.AddAck(request_id, "EngineDeadError", None, "aborted"))
        elif isinstance(message, ipc.Finish):
            for sample in message.samples:
                if core.finish_sample(sample.request_id, sample.index):
                    self.active.discard(sample.request_id)
        elif isinstance(message, ipc.Call):
            self._call(message)
        elif isinstance(message, ipc.Stop):
            self.stopping = True

    def _add(self, request) -> None:
        try:
            self.core.add_request(request)
        except Exception as e:  # noqa: BLE001 - refused: the caller hears why
            kind, param, message = ipc.describe_error(e)
            self.acks.append(ipc.AddAck(request.request_id, kind, param, message))
            return
        self.active.add(request.request_id)
        self.acks.append(ipc.AddAck(request.request_id))

    def _abort(self, request_id: str) -> None:
        try:
            self.core.abort_request(request_id)
        except Exception:  # noqa: BLE001 - one bad abort must not end the loop
            log.exception("abort of %s failed", request_id)

    def _admit_compiled(self) -> None:
        for request_id, (request, grammar) in list(self.pending.items()):
            if grammar.done():
                del self.pending[request_id]
                self._add(request)

    def _call(self, message: ipc.Call) -> None:
        try:
            if message.method == "snapshot":
                result = self.snapshots(self.core)
            elif message.method in ("start_profile", "stop_profile", "rank_reports",
                                    "clear_kv_tiers", "sleep", "wake_up"):  # fmt: skip
                result = getattr(self.core, message.method)(*message.args)
            else:
                raise ValueError(f"the engine core has no method {message.method!r}")
        except Exception as e:  # noqa: BLE001 - the caller gets it
            kind, _, text = ipc.describe_error(e)
            self.transport.send(ipc.CallResult(message.call_id, None, kind, text))
            return
        self.transport.send(ipc.CallResult(message.call_id, result))

    def _step(self) -> None:
        core = self.core
        before = self._stats or core.stats()
        started = time.monotonic()
        try:
            outputs = core.step()
        except EngineDeadError:
            raise  # fatal (e.g. a tensor-parallel worker died): the loop ends, the front end sees
        except Exception as e:  # noqa: BLE001 - the core guards its steps; this is a backstop
            self._fail_active(e)
            return
        now = time.monotonic()
        # NOTE: once per step: it snapshots every histogram; sent only now and then.
        self._stats = after = core.stats()
        self.stall.note(now - started, before, after)
        self._stuck = not outputs and after.steps == before.steps
        for out in outputs:
            if out.finished:
                self.active.discard(out.request_id)
        fresh = now - self._stats_at > STATS_EVERY_S or any(o.finished for o in outputs)
        if outputs or self.acks or fresh:
            self._stats_at = now if fresh else self._stats_at
            self._send_outputs(outputs, after if fresh else None)

    def _fail_active(self, error: Exception) -> None:
        log.exception("engine step raised; failing the requests in flight")
        message = f"the engine failed: {type(error).__name__}: {error}"
        failed = [ipc.Failure(request_id, message) for request_id in self.active]
        for request_id in self.active:
            self._abort(request_id)
        self.active.clear()
        self._stuck = False
        self._stats = self.core.stats()
        self._send_outputs([], self._stats, failed)

    def _send_outputs(self, outputs: list, stats, failed: list | None = None) -> None:
        acks, self.acks = self.acks, []
        self.transport.send(ipc.Outputs(outputs, acks, stats, self.stall.bound(), failed or []))
