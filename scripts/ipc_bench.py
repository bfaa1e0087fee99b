"""The process boundary's cost per message (docs/engine.md), for the choices in
engine/transport/ipc.py: msgspec against pickle, and the core's messages back over ZeroMQ or over a
pipe.

    python scripts/ipc_bench.py [--requests 32] [--rounds 2000]

For one step's `Outputs` of `--requests` decoding requests (one new token each, stats attached):
  encode+decode   CPU microseconds per message, msgspec and pickle (one thread, in this process:
                  repeatable)
  round trip      a ping-pong with a child process, commands over ZeroMQ as inferd sends them and
                  answers back over ZeroMQ or over the frame pipe: wall microseconds (median;
                  noisy on a shared machine, where a descheduled process dominates), and CPU
                  microseconds and context switches a trip of both processes, all threads
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import pickle
import statistics
import sys
import time


def step_message(requests: int):
    from inferd.engine.core.core_output import CoreOutput, RequestEvents, SampleDelta
    from inferd.engine.transport import ipc
    from inferd.engine_client import EngineStats
    from inferd.profiling.step_timer import StepTimer

    outputs = [CoreOutput(f"cmpl-{i:032x}-0", [SampleDelta(0, [1000 + i])], time.monotonic(),
                          RequestEvents(1.0, 2.0, 16, ())) for i in range(requests)]  # fmt: skip
    stats = EngineStats(requests, 0, 0.3, 0, 100, 20, 5000, 9000, 700, StepTimer().snapshot())
    return ipc.Outputs(outputs, [], stats, 61.0)


def codec_seconds(message, rounds: int) -> dict[str, float]:
    from inferd.engine.transport import ipc

    out = {}
    for name, enc, dec in (("msgspec", ipc.encode, ipc.decode_from_core),
                           ("pickle", pickle.dumps, pickle.loads)):  # fmt: skip
        start = time.process_time()
        for _ in range(rounds):
            dec(enc(message))
        out[name] = (time.process_time() - start) / rounds
    return out


def _echo(to_child: str, back, use_pipe: bool) -> None:
    """Answer every message with itself: over ZeroMQ, or over the frame pipe (as the core)."""
    import zmq

    from inferd.engine.transport.frame_pipe import FrameWriter

    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    pull.connect(to_child)
    if use_pipe:
        writer = FrameWriter(os.dup(back.fileno()))
        send = writer.send
    else:
        push = ctx.socket(zmq.PUSH)
        push.connect(back)
        send = push.send
    base = (0.0, 0)
    while (data := pull.recv()) != b"stop":
        if data == b"mark":  # the measured trips begin
            base = _usage()
        send(data)
    cpu, switches = _usage()
    send(pickle.dumps((cpu - base[0], switches - base[1])))


def _usage() -> tuple[float, int]:
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime, usage.ru_nvcsw + usage.ru_nivcsw


def round_trip(message, rounds: int, use_pipe: bool) -> dict[str, float]:
    """A ping-pong with a child: commands over ZeroMQ as inferd sends them, answers back over
    ZeroMQ or over the frame pipe. Wall time per trip (median), and CPU seconds and context
    switches per trip of both processes with all their threads (ZeroMQ's I/O threads too)."""
    from multiprocessing.connection import Connection

    import zmq

    from inferd.engine.transport import ipc
    from inferd.engine.transport.frame_pipe import FrameReader, open_frame_pipe

    ctx = multiprocessing.get_context("spawn")
    sockets = ipc.SocketDir()
    zctx = zmq.Context()
    push = zctx.socket(zmq.PUSH)
    push.bind(sockets.to_core)
    if use_pipe:
        read_fd, write_fd = open_frame_pipe()
        reader, back = FrameReader(read_fd), Connection(write_fd, readable=False)
        pending: list = []

        def receive():
            while not pending:
                reader.wait(None)
                pending.extend(reader.read())
            return pending.pop(0)
    else:
        pull = zctx.socket(zmq.PULL)
        back = f"ipc://{sockets.path / 'out'}"
        pull.bind(back)
        receive = pull.recv
    child = ctx.Process(target=_echo, args=(sockets.to_core, back, use_pipe))
    child.start()
    if use_pipe:
        back.close()
    for _ in range(50):  # warm-up: the child's imports and connects are not measured
        push.send(ipc.encode(message))
        receive()
    push.send(b"mark")
    receive()
    times = []
    cpu, switches = _usage()
    for _ in range(rounds):
        start = time.perf_counter()
        push.send(ipc.encode(message))
        ipc.decode_from_core(receive())
        times.append(time.perf_counter() - start)
    cpu_after, switches_after = _usage()
    push.send(b"stop")
    child_cpu, child_switches = pickle.loads(bytes(receive()))
    child.join()
    zctx.destroy(0)
    sockets.close()
    return {"wall": statistics.median(times),
            "cpu": (cpu_after - cpu + child_cpu) / rounds,
            "switches": (switches_after - switches + child_switches) / rounds}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2000)
    args = parser.parse_args()
    message = step_message(args.requests)
    codec = codec_seconds(message, args.rounds)
    from inferd.engine.transport import ipc

    print(f"one step's Outputs, {args.requests} requests: {len(ipc.encode(message))} bytes "
          f"(msgspec), {len(pickle.dumps(message))} bytes (pickle)")  # fmt: skip
    for name in codec:
        print(f"{name:9s} encode+decode {1e6 * codec[name]:6.1f} us CPU")
    for name, use_pipe in (("zeromq both ways", False), ("zeromq in, pipe back", True)):
        trip = round_trip(message, args.rounds, use_pipe)
        print(f"{name:21s} round trip {1e6 * trip['wall']:6.1f} us wall (median of "
              f"{args.rounds}), {1e6 * trip['cpu']:6.1f} us CPU and {trip['switches']:4.1f} "
              "context switches a trip (both processes, all threads)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
