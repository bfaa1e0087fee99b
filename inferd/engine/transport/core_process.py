"""The front end's handle on one engine core process: start it, talk to it, stop it (the
`CoreClient` contract, transport/contract.py, with a `start` and a `wait_ready` of its own).

    CoreProcess.start(config)  spawn the process (core_loop.py): a ZeroMQ socket carries
                               commands to it, a pipe its messages back (ipc.py says why)
    wait_ready()               block until the model is loaded: the core's `Ready` (what the
                               front end needs to know of it), or its start-up error, raised
    send(message)              never blocks (ZeroMQ queues it)
    recv(timeout)              the next message from the core (a blocking reader: `ProcessCore`)
    read_on(loop, callback)    or: the event loop hands every message to `callback`, and None
                               once the process is gone (the server's client: async_core_client.py)
    stop()                     ask it to stop, then wait, then kill

The process is spawned (never forked: the front end may hold threads, torch's among them) and is
no daemon, because a core with tensor parallelism starts processes of its own; it dies with the
front end instead (core_loop.py). Every test that starts one stops it.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import time
from collections import deque
from collections.abc import Callable
from multiprocessing.connection import Connection

from inferd.engine.transport import ipc
from inferd.engine.transport.core_spin import core_spin_count
from inferd.engine.transport.frame_pipe import FrameReader, open_frame_pipe

log = logging.getLogger(__name__)

STOP_TIMEOUT_S = 20.0


def _log_levels() -> dict[str, int]:
    """The levels set here that the core's process should share: the root's, inferd's own and
    its progress lines' (`--quiet`, inferd/progress.py)."""
    names = ("", "inferd", "inferd.progress")
    levels = {n: logging.getLogger(n).level for n in names}
    return {n: level for n, level in levels.items() if level != logging.NOTSET}


class CoreStartError(RuntimeError):
    """The engine core process could not start (its own error is in the message)."""


class CoreProcess:
    def __init__(self, index: int = 0):
        self.index = index  # which replica (data parallelism), for names and logs
        self.process: multiprocessing.Process | None = None
        self.ready: ipc.Ready | None = None
        self._dir: ipc.SocketDir | None = None
        self._context = self._send_socket = None
        self._reader: FrameReader | None = None  # the core's messages (frame_pipe.py)
        self._received: deque = deque()  # decoded, not yet taken by recv
        self._loop: asyncio.AbstractEventLoop | None = None  # read_on's loop
        self._memory_tier = False  # whether its config has a RAM KV tier (removed at stop)

    def start(self, config, stall_timeout: float = 60.0) -> None:
        import zmq

        from inferd.engine.core.core_loop import core_main

        self._memory_tier = bool(config.kv_offload_memory)
        self._dir = ipc.SocketDir()
        self._context = zmq.Context()
        self._send_socket = self._context.socket(zmq.PUSH)
        self._send_socket.setsockopt(zmq.SNDHWM, 0)
        self._send_socket.setsockopt(zmq.LINGER, 0)
        self._send_socket.bind(self._dir.to_core)
        read_fd, write_fd = open_frame_pipe()
        self._reader = FrameReader(read_fd)
        # NOTE: a Connection so that spawn passes the descriptor to the child (and only there).
        write_end = Connection(write_fd, readable=False)
        args = (config, self._dir.to_core, write_end, os.getpid(), stall_timeout,
                _log_levels())  # fmt: skip
        ctx = multiprocessing.get_context("spawn")
        self.process = ctx.Process(target=core_main, args=args, name=f"inferd-core-{self.index}")
        try:
            with core_spin_count():
                self.process.start()
        finally:
            write_end.close()  # the child's copy is the only one: its exit is the pipe's end

    def wait_ready(self, timeout: float | None = None) -> ipc.Ready:
        """Block until the core has loaded its model: its Ready, or its start-up error raised
        (a ValueError, such as a bad flag or model, as it is; anything else as CoreStartError)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            message = self.recv(0.2)
            if message is not None:
                return self._take_start(message)
            if not self.alive:
                raise CoreStartError(f"the engine core process exited during start-up "
                                     f"(exit code {self.exitcode})")  # fmt: skip
            if deadline is not None and time.monotonic() > deadline:
                raise CoreStartError(f"the engine core did not start within {timeout:g} s")

    def recv(self, timeout: float | None = None):
        """The core's next message, or None after `timeout` seconds (None: wait for one)."""
        if not self._received:
            reader = self._reader
            if reader is None or reader.eof:
                self.process.join(timeout)  # nothing more will come: wait for the exit itself
                return None
            if not reader.wait(timeout):
                return None
            self._received.extend(ipc.decode_from_core(f) for f in reader.read())
            if not self._received:
                return None
        return self._received.popleft()

    def read_on(self, loop: asyncio.AbstractEventLoop,
                callback: Callable[[object | None], None]) -> None:  # fmt: skip
        """From now on `loop` (the running loop: call this on its thread) receives the core's
        messages and calls `callback` with each; with None once the process has ended and what
        it sent before is read.

        Why on the loop and not in a thread: a reader thread must take the GIL back after each
        wait and then wake the loop through its self-pipe (`call_soon_threadsafe`), two hand-offs
        per step that showed up in profiles of the served process under load."""
        reader = self._reader

        def drain() -> None:
            while self._received:  # what a blocking recv read before the watch began
                callback(self._received.popleft())
            if self._reader is not reader:
                return  # stopped (and its pipe closed) since this call was scheduled
            for frame in reader.read():
                if self._reader is not reader:
                    return  # a callback stopped this core: the rest is for nobody
                callback(ipc.decode_from_core(frame))
            if reader.eof:
                loop.remove_reader(reader.fd)  # the core is gone; `ended` says so

        def ended() -> None:
            if self._loop is None:
                return
            if not reader.eof:
                drain()  # what the core wrote before it died is all in the pipe now
            self._unwatch()
            callback(None)

        self._loop = loop
        loop.add_reader(reader.fd, drain)
        loop.add_reader(self.sentinel, ended)
        loop.call_soon(drain)  # messages that arrived before the watch

    def _unwatch(self) -> None:
        """Stop read_on's watching (on the loop's thread, as read_on itself)."""
        if self._loop is None:
            return
        loop, self._loop = self._loop, None
        if self._reader is not None:
            loop.remove_reader(self._reader.fd)
        if self.process is not None:
            loop.remove_reader(self.sentinel)

    def _take_start(self, message) -> ipc.Ready:
        if isinstance(message, ipc.StartFailed):
            self.process.join(10)
            error = ipc.rebuild_error(message.error_type, None, message.message)
            if isinstance(error, ValueError):
                raise error  # a bad flag or model: the CLI prints it as it would in-process
            raise CoreStartError(f"the engine core failed to start: {message.message}")
        if not isinstance(message, ipc.Ready):
            raise CoreStartError(f"the engine core sent {type(message).__name__} before Ready")
        self.ready = message
        return message

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.is_alive()

    @property
    def end_reason(self) -> str:
        """Why the core serves no more, once `read_on` said it ended (its exit code may not be
        known yet: the sentinel can fire a moment before the process is reaped)."""
        return f"engine core {self.index} exited (exit code {self.exitcode})"

    @property
    def exitcode(self) -> int | None:
        return None if self.process is None else self.process.exitcode

    @property
    def sentinel(self) -> int:
        """A file descriptor that becomes readable when the process ends."""
        return self.process.sentinel

    def send(self, message) -> None:
        self.send_bytes(ipc.encode(message))

    def send_bytes(self, data: bytes) -> None:
        import zmq

        try:
            self._send_socket.send(data, zmq.NOBLOCK)
        except zmq.ZMQError as e:  # closed: the core is gone or being stopped
            log.debug("message to core %d dropped: %s", self.index, e)

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """Ask the core to stop (it fails nothing: the caller ended its requests), wait, then
        kill it. Safe to call more than once."""
        if self.process is not None and self.process.is_alive():
            self.send(ipc.Stop())
            self.process.join(timeout)
            if self.process.is_alive():
                log.warning("engine core %d did not stop in %.0f s: killing it", self.index,
                            timeout)  # fmt: skip
                self.process.kill()
                self.process.join(5)
        self._unwatch()
        if self._send_socket is not None:
            self._send_socket.close(0)
            self._send_socket = None
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        if self._context is not None:
            self._context.term()
            self._context = None
        if self._dir is not None:
            self._dir.close()
            self._dir = None
        if self._memory_tier:  # the RAM KV tier is this process's: gone with its cores
            from inferd.engine.kv_tiers.connector import remove_memory_tier

            remove_memory_tier(os.getpid())
