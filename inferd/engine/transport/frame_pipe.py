"""A one-way OS pipe carrying length-prefixed frames, from an engine core to its front end.

    writer, reader = open_frame_pipe()        before the core's process is spawned
    FrameWriter.send(data)                    the core: never blocks; what the pipe cannot take
                                              yet waits in the writer's own buffer (`flush`)
    FrameReader.read() -> frames             the front end: what has arrived, whole frames only

Why a pipe and not a ZeroMQ socket for this direction: ZeroMQ hands every send to an I/O thread
of its own on both sides, so each step's outputs cost two extra thread wake-ups, and on a CPU
with as many cores as compute threads each wake-up preempts one of them. Here the core's loop
writes to the kernel itself and the front end's event loop reads the same file descriptor, with
nothing in between (docs/engine.md has the measurement). A frame is a 4-byte little-endian
length, then the payload.
"""

from __future__ import annotations

import fcntl
import os
import select
import struct
import time

_HEADER = struct.Struct("<I")
PIPE_BYTES = 1 << 20  # asked of the kernel; an unprivileged process may get up to this by default
_READ_BYTES = PIPE_BYTES


def open_frame_pipe() -> tuple[int, int]:
    """(read fd, write fd), both inheritable by a spawned child only when passed to it."""
    read_fd, write_fd = os.pipe()
    try:
        fcntl.fcntl(write_fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    except (AttributeError, OSError):
        pass  # not Linux, or above the system's limit: the default size (64 KiB) still works
    return read_fd, write_fd


class FrameWriter:
    def __init__(self, fd: int):
        os.set_blocking(fd, False)
        self.fd = fd
        self._pending = bytearray()  # bytes the pipe has not taken yet, in order
        self.broken = False  # the reader is gone: what is sent is dropped

    @property
    def pending(self) -> bool:
        return bool(self._pending)

    def send(self, data: bytes) -> None:
        if self.broken:
            return
        header = _HEADER.pack(len(data))
        if self._pending:
            self._pending += header
            self._pending += data
            self.flush()
            return
        written = self._write([header, data])
        if written < len(header) + len(data) and not self.broken:
            self._pending += (header + data)[written:]

    def flush(self) -> bool:
        """Write what the pipe now takes of the buffer; True once nothing is left."""
        if self._pending and not self.broken:
            del self._pending[: self._write([self._pending])]
        return not self._pending

    def drain(self, timeout: float) -> None:
        """Wait up to `timeout` seconds for the reader to take the buffer (at exit)."""
        deadline = time.monotonic() + timeout
        while not self.flush() and not self.broken:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            select.select([], [self.fd], [], left)

    def _write(self, parts: list) -> int:
        try:
            return os.writev(self.fd, parts)
        except BlockingIOError:
            return 0
        except BrokenPipeError:
            self.broken = True
            self._pending.clear()
            return 0

    def close(self) -> None:
        os.close(self.fd)


class FrameReader:
    def __init__(self, fd: int):
        os.set_blocking(fd, False)
        self.fd = fd
        self._buffer = bytearray()  # the start of a frame not whole yet
        self.eof = False  # every writer closed its end: nothing more will come

    def read(self) -> list[memoryview]:
        """The whole frames that have arrived (maybe none); sets `eof` once the writer is gone."""
        frames: list[memoryview] = []
        while not self.eof:
            try:
                data = os.read(self.fd, _READ_BYTES)
            except BlockingIOError:
                break
            if not data:
                self.eof = True
                break
            self._split(data, frames)
            if len(data) < _READ_BYTES:
                break  # the pipe is empty now: spare the read that would say so
        return frames

    def wait(self, timeout: float | None) -> bool:
        """Block until something can be read (or the writer is gone), at most `timeout` s."""
        return bool(select.select([self.fd], [], [], timeout)[0])

    def _split(self, data: bytes, frames: list) -> None:
        if self._buffer:
            self._buffer += data
            data = bytes(self._buffer)
            self._buffer.clear()
        view, at, end = memoryview(data), 0, len(data)
        while end - at >= _HEADER.size:
            (size,) = _HEADER.unpack_from(data, at)
            if end - at - _HEADER.size < size:
                break
            start = at + _HEADER.size
            frames.append(view[start : start + size])  # no copy: msgspec reads views
            at = start + size
        if at < end:
            self._buffer += data[at:]

    def close(self) -> None:
        os.close(self.fd)
