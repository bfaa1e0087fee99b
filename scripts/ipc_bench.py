"""The process boundary's cost per message (docs/engine.md), for the choice in engine/ipc.py:
ZeroMQ (ipc:// sockets) with msgspec against multiprocessing's Pipe with pickle.

    python scripts/ipc_bench.py [--requests 32] [--rounds 2000]

Two figures per transport, for one step's `Outputs` of `--requests` decoding requests (one new
token each, stats attached):
  encode+decode   CPU microseconds per message (one thread, in this process: repeatable)
  round trip      wall microseconds of a ping-pong with a child process (median; noisy on a
                  shared machine, where a descheduled process dominates)
"""

from __future__ import annotations

import argparse
import multiprocessing
import pickle
import statistics
import sys
import time


def step_message(requests: int):
    from inferd.engine import ipc
    from inferd.engine.core_output import CoreOutput, RequestEvents, SampleDelta
    from inferd.engine_client import EngineStats
    from inferd.profiling.step_timer import StepTimer

    outputs = [CoreOutput(f"cmpl-{i:032x}-0", [SampleDelta(0, [1000 + i])], time.monotonic(),
                          RequestEvents(1.0, 2.0, 16, ())) for i in range(requests)]  # fmt: skip
    stats = EngineStats(requests, 0, 0.3, 0, 100, 20, 5000, 9000, 700, StepTimer().snapshot())
    return ipc.Outputs(outputs, [], stats, 61.0)


def codec_seconds(message, rounds: int) -> dict[str, float]:
    from inferd.engine import ipc

    out = {}
    for name, enc, dec in (("zeromq+msgspec", ipc.encode, ipc.decode_from_core),
                           ("pipe+pickle", pickle.dumps, pickle.loads)):  # fmt: skip
        start = time.process_time()
        for _ in range(rounds):
            dec(enc(message))
        out[name] = (time.process_time() - start) / rounds
    return out


def _zmq_echo(to_child: str, from_child: str) -> None:
    import zmq

    ctx = zmq.Context()
    pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    pull.connect(to_child)
    push.connect(from_child)
    while (data := pull.recv()) != b"stop":
        push.send(data)


def _pipe_echo(conn) -> None:
    while (data := conn.recv_bytes()) != b"stop":
        conn.send_bytes(data)


def round_trips(message, rounds: int) -> dict[str, float]:
    import zmq

    from inferd.engine import ipc

    ctx = multiprocessing.get_context("spawn")
    out = {}
    sockets = ipc.SocketDir()
    zctx = zmq.Context()
    push, pull = zctx.socket(zmq.PUSH), zctx.socket(zmq.PULL)
    push.bind(sockets.to_core)
    pull.bind(sockets.from_core)
    child = ctx.Process(target=_zmq_echo, args=(sockets.to_core, sockets.from_core))
    child.start()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        push.send(ipc.encode(message))
        ipc.decode_from_core(pull.recv())
        times.append(time.perf_counter() - start)
    push.send(b"stop")
    child.join()
    zctx.destroy(0)
    sockets.close()
    out["zeromq+msgspec"] = statistics.median(times)
    parent, child_end = ctx.Pipe()
    child = ctx.Process(target=_pipe_echo, args=(child_end,))
    child.start()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        parent.send_bytes(pickle.dumps(message))
        pickle.loads(parent.recv_bytes())
        times.append(time.perf_counter() - start)
    parent.send_bytes(b"stop")
    child.join()
    out["pipe+pickle"] = statistics.median(times)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2000)
    args = parser.parse_args()
    message = step_message(args.requests)
    codec = codec_seconds(message, args.rounds)
    trips = round_trips(message, args.rounds)
    from inferd.engine import ipc

    print(f"one step's Outputs, {args.requests} requests: {len(ipc.encode(message))} bytes "
          f"(msgspec), {len(pickle.dumps(message))} bytes (pickle)")  # fmt: skip
    for name in codec:
        print(f"{name:15s} encode+decode {1e6 * codec[name]:7.1f} us CPU, round trip "
              f"{1e6 * trips[name]:7.1f} us wall (median of {args.rounds})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
