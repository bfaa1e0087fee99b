"""An engine replica: one Serve replica (a Ray actor) holding one inferd engine behind its
`EngineClient` (today `AsyncEngine`: the engine loop thread inside this actor).

    ingress ──handle.generate(EngineCall)──▶ EngineReplica.generate ──▶ EngineClient.add_request
    ingress ◀── Accepted / Refused, outputs, Failed ◀── the request's asyncio queue

`generate` is a streaming handle method: the ingress cancelling its call (the client went away,
or an abort) cancels the generator here, which aborts the engine request before its next step.
Outputs that piled up while the ingress was reading are sent as the latest one only: they are
cumulative.

Every `report_interval_s` the replica pushes a `ReplicaReport` (health, stats) to the ingress,
which is how the ingress knows which replicas serve, aggregates their stats and exports each
one's metrics with a `replica` label. `check_health` is Serve's own probe: an engine that died
or stalls fails it, and Serve replaces the replica.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import ray
from ray import serve

from inferd.engine_client import EngineClient, TokenizerLike
from inferd.ray_serve.wire import (
    Accepted,
    EngineCall,
    EngineFacts,
    ErrorData,
    Failed,
    PromptMemo,
    Refused,
    ReplicaDescription,
    ReplicaReport,
    replica_arrival,
)

log = logging.getLogger(__name__)

_REPORT_TIMEOUT_S = 10.0


@dataclass
class ReplicaEngine:
    """What the engine factory returns: a started-on-demand engine client and its facts."""

    client: EngineClient
    facts: EngineFacts


def _shippable(tokenizer: TokenizerLike) -> TokenizerLike:
    """The tokenizer without its compiled chat template (Jinja's compiled code does not pickle;
    the ingress compiles the same source again on first use)."""
    if getattr(tokenizer, "chat_template", None) is None:
        return tokenizer
    shipped = copy.copy(tokenizer)
    shipped.chat_template = tokenizer.chat_template  # NOTE: setting the source drops the compiled
    return shipped


class EngineReplica:
    async def __init__(
        self,
        make_engine: Callable[[], ReplicaEngine],
        ingress: str,  # the ingress deployment's name, for the reports
        report_interval_s: float = 1.0,
    ):
        context = serve.get_replica_context()
        self.replica = context.replica_id.unique_id
        self.node = ray.get_runtime_context().get_node_id()
        engine = await asyncio.to_thread(make_engine)  # loads the model; the loop stays free
        self.client, self.facts = engine.client, engine.facts
        self.client.start()
        self._interval = report_interval_s
        self._ingress = serve.get_deployment_handle(ingress, app_name=context.app_name)
        self._reports = asyncio.ensure_future(self._report_loop())
        log.info("engine replica %s on node %s serves %s", self.replica, self.node,
                 self.client.model_info.name)  # fmt: skip

    # ---- what the ingress calls ------------------------------------------------------------
    def describe(self) -> ReplicaDescription:
        return ReplicaDescription(self.client.model_info, _shippable(self.client.tokenizer),
                                  self.facts, self.replica, self.node,
                                  self.client.stats())  # fmt: skip

    async def generate(self, call: EngineCall) -> AsyncIterator[Any]:
        outputs: asyncio.Queue = asyncio.Queue()
        try:
            await self.client.add_request(call.request_id, call.engine_prompt, call.params,
                                          outputs, replica_arrival(call.waited_s))  # fmt: skip
        except Exception as e:  # noqa: BLE001 - the ingress raises it again, typed
            yield Refused(ErrorData.of(e))
            return
        memo, finished = PromptMemo(), False
        try:
            # NOTE: inside the try: a cancel that lands on this yield must abort the request too.
            yield Accepted(self.replica, self.node, time.monotonic())
            while not finished:
                items = [await outputs.get()]
                while not outputs.empty():
                    items.append(outputs.get_nowait())
                latest = None
                for item in items:
                    if isinstance(item, BaseException):
                        if latest is not None:
                            yield memo.thin(latest)
                        finished = True  # the engine ended it: nothing to abort
                        yield Failed(ErrorData.of(item))
                        return
                    latest = item
                finished = latest.finished
                yield memo.thin(latest)
        finally:
            if not finished:  # cancelled by the ingress, or the stream broke
                self.client.abort(call.request_id)

    # ---- what Serve calls ------------------------------------------------------------------
    def check_health(self) -> None:
        problem = self.client.health()
        if problem is not None:
            raise RuntimeError(f"engine replica {self.replica}: {problem}")

    def record_routing_stats(self) -> dict[str, Any]:
        """Read by inferd's router (router.py): how many blocks this replica's cache holds."""
        return {"num_kv_blocks": self.facts.num_kv_blocks}

    async def __del__(self) -> None:
        if not hasattr(self, "_reports"):  # stopped while it was still loading the model
            return
        self._reports.cancel()
        try:
            await asyncio.wait_for(self._ingress.report.remote(self._report(stopping=True)), 2.0)
        except Exception:  # noqa: BLE001 - best effort: the ingress also notices the silence
            pass
        self.client.stop()

    # ---- reports ---------------------------------------------------------------------------
    def _report(self, stopping: bool = False) -> ReplicaReport:
        return ReplicaReport(self.replica, self.node, self.client.health(), self.client.stats(),
                             stopping)  # fmt: skip

    async def _report_loop(self) -> None:
        failing = False
        while True:
            try:
                await asyncio.wait_for(self._ingress.report.remote(self._report()),
                                       _REPORT_TIMEOUT_S)  # fmt: skip
                failing = False
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - the ingress may be restarting
                if not failing:
                    log.warning("replica %s: report to the ingress failed: %s", self.replica, e)
                failing = True
            await asyncio.sleep(self._interval)
