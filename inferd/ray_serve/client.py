"""`RayEngineClient`: the `EngineClient` (inferd/engine_client.py) the ingress's FastAPI app is
built on, over a Serve deployment handle to the engine replicas. The server's routes, validation,
templates, tools and streams are `inferd serve`'s own; only the engine is elsewhere.

    add_request ──handle.generate(EngineCall), streaming──▶ a replica chosen by the request router
                ◀── Accepted / Refused: add_request returns, or raises the typed error
    a pump task per request: outputs ──▶ the request's queue (observers first, for metrics)
    abort ──▶ cancels the pump, which cancels the handle call: the replica aborts the request

Faults: when the replica's actor dies before it took a request, nothing ran and the request goes
to another replica (up to `max_attempts`); once it runs, the request fails with `RequestFailed`
naming the replica (a stream gets an error event and `[DONE]`), the replica leaves the board
and Serve starts a replacement. Other requests are not affected.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from ray.exceptions import RayActorError
from ray.serve.handle import DeploymentHandle

from inferd.engine_client import EngineStats, ModelInfo, PromptInput, TokenizerLike
from inferd.errors import EngineDeadError, RequestFailed
from inferd.outputs import RequestOutput
from inferd.ray_serve.replica_board import ReplicaBoard
from inferd.ray_serve.wire import (
    Accepted,
    EngineCall,
    Failed,
    PromptMemo,
    Refused,
    ReplicaDescription,
    shifted,
)
from inferd.sampling_params import SamplingParams

log = logging.getLogger(__name__)


class RayEngineClient:
    def __init__(self, handle: DeploymentHandle, description: ReplicaDescription,
                 board: ReplicaBoard, max_attempts: int = 3):  # fmt: skip
        self._generate = handle.options(method_name="generate", stream=True)
        self.description = description
        self.board = board
        self.max_attempts = max_attempts
        self._observers: list[Callable[[RequestOutput], None]] = []
        self._pumps: dict[str, asyncio.Task] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopped = False

    @property
    def model_info(self) -> ModelInfo:
        return self.description.model_info

    @property
    def tokenizer(self) -> TokenizerLike:
        return self.description.tokenizer

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()

    def stop(self, timeout: float = 30.0) -> None:
        self._stopped = True
        for pump in list(self._pumps.values()):
            pump.cancel()

    def health(self) -> str | None:
        return "the server is stopping" if self._stopped else self.board.health()

    def stats(self) -> EngineStats:
        return self.board.stats()

    def observe_outputs(self, callback: Callable[[RequestOutput], None]) -> None:
        self._observers.append(callback)

    async def clear_kv_tiers(self) -> int:
        """Not offered (POST /kv/clear answers 501 with this message): a Serve handle call
        reaches the one replica the router picks, never each of them, so a clear through it
        would leave the other replicas' tiers full while reporting success."""
        raise NotImplementedError(
            "clearing the KV tiers is not supported with --ray: a Serve deployment handle "
            "reaches one replica per call, not every replica, so it cannot empty all of their "
            "tiers (a disk tier's blocks are the files under --kv-offload-dir on each node)"
        )

    # ---- sleep: not offered (/sleep, /wake_up and /is_sleeping answer 501 with this reason) ----
    wake_on_request = False
    _NO_SLEEP = ("sleep is not supported with --ray: a Serve deployment handle reaches one "
                 "replica per call, not every replica, so it cannot put all of them to sleep "
                 "or wake them")  # fmt: skip

    async def sleep(self, level: int) -> dict:
        raise NotImplementedError(self._NO_SLEEP)

    async def wake_up(self) -> dict:
        raise NotImplementedError(self._NO_SLEEP)

    def is_sleeping(self) -> bool:
        raise NotImplementedError(self._NO_SLEEP)

    # ---- requests ----------------------------------------------------------------------------
    async def add_request(
        self,
        request_id: str,
        prompt: PromptInput,
        params: SamplingParams,
        outputs: asyncio.Queue,
        arrival_time: float | None = None,
    ) -> None:
        if self._stopped or self._loop is None:
            raise EngineDeadError("the server is not running")
        arrival = arrival_time if arrival_time is not None else time.monotonic()
        why = "no replica answered"
        for _ in range(self.max_attempts):
            call = EngineCall(request_id, prompt, params, time.monotonic() - arrival)
            stream = self._generate.remote(call)
            try:
                first = await stream.__anext__()
            except asyncio.CancelledError:
                stream.cancel()
                raise
            except RayActorError as e:  # it died before taking the request: nothing ran
                why = f"the replica died ({type(e).__name__})"
                continue
            except StopAsyncIteration:
                why = "the replica ended the call without an answer"
                continue
            if isinstance(first, Refused):
                error = first.error.error()
                if isinstance(error, EngineDeadError):  # Serve replaces it; try another
                    why = str(error)
                    continue
                raise error
            assert isinstance(first, Accepted)
            self.board.count_decision(call.decision)
            offset = time.monotonic() - first.clock
            pump = self._loop.create_task(self._pump(request_id, stream, first, offset,
                                                     arrival, outputs))  # fmt: skip
            self._pumps[request_id] = pump
            return
        raise EngineDeadError(f"no engine replica could take the request: {why}")

    def abort(self, request_id: str) -> None:
        pump = self._pumps.pop(request_id, None)
        if pump is not None:
            pump.cancel()

    async def _pump(self, request_id: str, stream: Any, accepted: Accepted, offset: float,
                    arrival: float, outputs: asyncio.Queue) -> None:  # fmt: skip
        memo = PromptMemo()
        try:
            async for item in stream:
                if isinstance(item, Failed):
                    outputs.put_nowait(item.error.error())
                    return
                out = shifted(memo.fill(item), offset, arrival)
                for observe in self._observers:
                    try:
                        observe(out)
                    except Exception:  # noqa: BLE001 - metrics must never break delivery
                        log.exception("output observer failed")
                outputs.put_nowait(out)
                if out.finished:
                    return
            outputs.put_nowait(RequestFailed(f"engine replica {accepted.replica} ended the "
                                             "request's stream before it finished"))  # fmt: skip
        except asyncio.CancelledError:
            stream.cancel()  # the replica's generator is cancelled: it aborts the request
            if self._stopped:  # not an abort: the server stops with requests in flight
                outputs.put_nowait(EngineDeadError("the server stopped"))
            raise
        except RayActorError as e:
            self.board.lost(accepted.replica, f"its actor died ({type(e).__name__})")
            outputs.put_nowait(
                RequestFailed(
                    f"the engine replica {accepted.replica} (node {accepted.node[:12]}) died while "
                    f"running this request ({type(e).__name__}); other replicas keep serving"
                )
            )
        except Exception as e:  # noqa: BLE001 - this request's failure, not the server's
            log.exception("stream from engine replica %s failed", accepted.replica)
            outputs.put_nowait(
                RequestFailed(
                    f"the engine replica {accepted.replica} failed: {type(e).__name__}: {e}"
                )
            )
        finally:
            if self._pumps.get(request_id) is asyncio.current_task():
                del self._pumps[request_id]
