"""The frame pipe from an engine core to its front end (inferd/engine/transport/frame_pipe.py):
whole frames in order, a writer that never blocks, an end the reader sees."""

from __future__ import annotations

import os

import pytest

from inferd.engine.transport.frame_pipe import FrameReader, FrameWriter, open_frame_pipe


@pytest.fixture
def pipe():
    read_fd, write_fd = open_frame_pipe()
    reader, writer = FrameReader(read_fd), FrameWriter(write_fd)
    yield reader, writer
    for fd in (read_fd, write_fd):
        try:
            os.close(fd)
        except OSError:
            pass  # the test closed it


def _read_all(reader: FrameReader, writer: FrameWriter) -> list[bytes]:
    frames = []
    while True:
        got = reader.read()
        frames += [bytes(f) for f in got]
        if not writer.flush():
            continue
        if not got:
            return frames


def test_frames_arrive_whole_and_in_order(pipe):
    reader, writer = pipe
    sent = [b"", b"a", bytes(range(256)) * 3, b"last"]
    for data in sent:
        writer.send(data)
    assert [bytes(f) for f in reader.read()] == sent
    assert reader.read() == []
    assert not reader.eof


def test_a_frame_split_across_reads_is_kept_until_whole(pipe):
    reader, writer = pipe
    frame = b"\x05\x00\x00\x00hello"
    os.write(writer.fd, frame[:3])
    assert reader.read() == []
    os.write(writer.fd, frame[3:7])
    assert reader.read() == []
    os.write(writer.fd, frame[7:] + b"\x01\x00\x00\x00!")
    assert [bytes(f) for f in reader.read()] == [b"hello", b"!"]


def test_the_writer_never_blocks_and_keeps_what_the_pipe_cannot_take(pipe):
    reader, writer = pipe
    chunk = os.urandom(100_000)
    sent = [chunk + bytes([i]) for i in range(40)]  # 4 MB: more than any pipe's buffer
    for data in sent:
        writer.send(data)  # a blocking write would hang here: nobody reads yet
    assert writer.pending
    assert not writer.flush()
    assert _read_all(reader, writer) == sent
    assert not writer.pending


def test_the_reader_sees_the_end_once_the_writer_closed(pipe):
    reader, writer = pipe
    writer.send(b"bye")
    writer.close()
    assert [bytes(f) for f in reader.read()] == [b"bye"]
    assert reader.read() == [] and reader.eof
    assert reader.wait(0)  # an ended pipe never blocks a waiting reader


def test_a_writer_whose_reader_is_gone_drops_what_it_sends(pipe):
    reader, writer = pipe
    reader.close()
    writer.send(b"nobody reads this")
    assert writer.broken and not writer.pending
    writer.send(b"nor this")  # no error: the core's loop notices `broken` and stops
    writer.drain(0.1)
