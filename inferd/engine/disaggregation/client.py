"""The server's engine client for disaggregated serving (`inferd serve --disaggregate`): the
data-parallel client (engine/frontend/async_core_client.py) whose engines have roles
(engine_roles.py), with a request's life in two engines.

    add_request ─▶ decode engine chosen (the router's prefix affinity, with its load bound)
               ─▶ route_prompt (routing.py): direct to it, or first a prefill engine by load
    prefill engine: computes the prompt under a one-token copy of the request; every full
               block is saved write-through into the transfer tier (the KV connector's RAM
               tier in /dev/shm), and its finished output stays in the front end
    hand-over: the front end waits until the prompt's last handed block is in the tier
               (transfer_watch.py), then sends the request itself to the decode engine
    decode engine: its connector loads the handed blocks as prefix-cache hits, computes the
               last partial block and samples every token: the client hears only from it

The decode engine samples the first token too: seeded sampling, logprobs, grammars and stop
rules then run in one engine exactly as colocated, and in the default mode (batch- and
chunk-invariant kernels) greedy tokens are identical to colocated serving. The cost: one step
of fewer than block-size tokens on the decode engine before the first token (docs/
distributed.md has it measured). A block that has not arrived when the decode engine's wait
for it ends (the connector's LOAD_WAIT_S), or that was lost, is recomputed there and counted
(ledger.py).

Faults: a prefill engine that dies hands its unfinished prompts to their decode engines, which
compute them whole; a decode engine that dies fails its own requests (as a data-parallel
replica's); the client is dead once every decode engine is.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from inferd.engine.core.core_output import CoreRequest
from inferd.engine.disaggregation.engine_roles import (
    DECODE,
    PREFILL,
    check_disaggregation,
    engine_roles,
    transfer_config,
)
from inferd.engine.disaggregation.ledger import TransferLedger
from inferd.engine.disaggregation.routing import DEFAULT_MIN_PROMPT, handed_blocks, route_prompt
from inferd.engine.disaggregation.transfer_watch import TransferWatch
from inferd.engine.frontend.async_core_client import AsyncCoreClient, CoreReplica, _settle
from inferd.engine.frontend.dp_router import NoReplica
from inferd.engine.kv_tiers.connector import memory_tier_root
from inferd.engine.transport import ipc
from inferd.engine_client import EngineStats, PromptInput
from inferd.engine_snapshot import EngineSnapshot
from inferd.errors import EngineDeadError, InvalidRequest
from inferd.pooling_params import PoolingParams
from inferd.sampling_params import SamplingParams

log = logging.getLogger(__name__)

NO_SLEEP = "sleep is not supported with --disaggregate"


@dataclass
class Handoff:
    """A request while a prefill engine computes its prompt."""

    prefill: int
    decode: int  # the decode engine chosen at admission (re-chosen at hand-over if it died)
    message: bytes  # the request's Add for the decode engine
    blocks: int  # full blocks the decode engine can take (routing.handed_blocks)
    last_block: bytes  # the name of the last of them: once it is in the tier, they all are
    handing: bool = False  # its prompt is done; its blocks' writes are being waited for


class DisaggregatedClient(AsyncCoreClient):
    def __init__(self, config, prefill_engines: int = 1, decode_engines: int = 1,
                 min_prompt: int = DEFAULT_MIN_PROMPT,
                 stall_timeout: float = 60.0):  # fmt: skip
        check_disaggregation(config, prefill_engines, decode_engines, min_prompt)
        self.roles = engine_roles(prefill_engines, decode_engines)
        self.min_prompt = min_prompt
        super().__init__(transfer_config(config), len(self.roles), "prefix", stall_timeout)
        self.ledger = TransferLedger(self.roles)
        self._handoffs: dict[str, Handoff] = {}
        self._arriving: dict[str, tuple[int, int]] = {}  # rid → (decode engine, handed blocks)
        self.routes: dict[str, int] = {}  # route_prompt's reasons, counted (logs, tests)
        # NOTE: the engines' RAM tier is this process's (core_loop.py passes its pid).
        self.watch = TransferWatch(memory_tier_root(os.getpid()))

    def launch(self) -> None:
        super().launch()
        # The router remembers what the decode engines' pools hold: their blocks only.
        self.router.capacity = max(1, self.router.capacity * self.roles.count(DECODE)
                                   // len(self.roles))  # fmt: skip

    def _name(self, index: int) -> str:
        return f"{self.roles[index]} engine core {index}"

    def _loads(self, role: str) -> list[int | None]:
        """Each engine's unfinished requests; None for a dead one or one of the other role."""
        return [None if r.dead is not None or self.roles[i] != role else len(r.active)
                for i, r in enumerate(self.replicas)]  # fmt: skip

    # ---- admission (event loop) --------------------------------------------------------------
    def _admit(self, request_id: str, prompt: PromptInput, params: SamplingParams | PoolingParams,
               arrival_time: float | None) -> tuple[CoreReplica, Callable[[], None]]:  # fmt: skip
        request, text = self.inputs.make_request(request_id, prompt, params, arrival_time)
        message = _encoded(request)
        ids = request.prompt_token_ids
        try:
            decode, holds = self.router.choose_holding(ids, request.cache_salt,
                                                       self._loads(DECODE),
                                                       request.lora_request)  # fmt: skip
        except NoReplica as e:
            raise EngineDeadError("every decode engine is dead") from e
        needs_prompt = request.pooling is not None or request.params.prompt_logprobs is not None
        route = route_prompt(len(ids), self.router.block_size, holds, self.min_prompt,
                             self._loads(PREFILL), needs_prompt)  # fmt: skip
        self.routes[route.reason] = self.routes.get(route.reason, 0) + 1
        self.outputs.add_request(request_id, text, ids, request.pooling or params,
                                 request.arrival_time, getattr(params, "max_tokens", None),
                                 stream=True)  # fmt: skip
        if route.prefill is None:
            target, payload = self.replicas[decode], message
            self._arriving.pop(request_id, None)
        else:
            target, payload = self.replicas[route.prefill], _encoded(_prompt_only(request))
            blocks = handed_blocks(len(ids), self.router.block_size)
            names = self.router.block_names(ids, request.cache_salt, request.lora_request)
            self._handoffs[request_id] = Handoff(route.prefill, decode, message, blocks,
                                                 names[blocks - 1])  # fmt: skip
        return target, lambda: target.process.send_bytes(payload)

    def _forget(self, request_id: str) -> None:
        self._handoffs.pop(request_id, None)
        self._arriving.pop(request_id, None)
        super()._forget(request_id)

    # ---- the engines' messages (event loop) --------------------------------------------------
    def _on_message(self, replica: CoreReplica, message) -> None:
        if isinstance(message, ipc.Outputs):
            if self.roles[self.replicas.index(replica)] == PREFILL:
                return self._on_prefill_outputs(replica, message)
            self._note_arrivals(message)
        super()._on_message(replica, message)

    def _on_prefill_outputs(self, replica: CoreReplica, message: ipc.Outputs) -> None:
        """A prefill engine's news: acks (its refusal is the request's, as colocated) and
        finished prompts; its sampled token is never shown."""
        replica.heard_at = time.monotonic()
        replica.stall_bound = message.stall_bound or replica.stall_bound
        if message.stats is not None:
            replica.stats = message.stats
        for ack in message.acks:
            if ack.error_type is not None:
                self._forget(ack.request_id)
            _settle(self._acks.get(ack.request_id), None, ack.error_type, ack.param, ack.message)
        ended = [(o.request_id, o.error is None) for o in message.outputs if o.finished]
        ended += [(f.request_id, False) for f in message.failed]  # decode computes it whole
        for request_id, computed in ended:
            replica.active.discard(request_id)
            handoff = self._handoffs.get(request_id)
            if handoff is not None and not handoff.handing:
                handoff.handing = True
                asyncio.ensure_future(self._hand_over(request_id, handoff, computed))

    async def _hand_over(self, request_id: str, handoff: Handoff, computed: bool) -> None:
        if computed:  # else the decode engine computes what is not in the tier
            started = time.monotonic()
            await self.watch.wait(handoff.last_block)  # NOTE: after it, late blocks recompute
            self.ledger.handed_over(handoff.prefill, time.monotonic() - started)
        if self._handoffs.pop(request_id, None) is None or request_id not in self._queues:
            self._forget(request_id)  # aborted (or failed) meanwhile
            return
        self._to_decode(request_id, handoff)

    def _to_decode(self, request_id: str, handoff: Handoff) -> None:
        loads = self._loads(DECODE)
        decode = handoff.decode
        if loads[decode] is None:  # it died meanwhile: the least loaded live one
            live = [i for i, n in enumerate(loads) if n is not None]
            if not live:
                self._fail({request_id}, EngineDeadError("every decode engine is dead"))
                return
            decode = min(live, key=lambda i: (loads[i], i))
        replica = self.replicas[decode]
        self._replica_of[request_id] = replica
        if not replica.active:
            replica.heard_at = time.monotonic()
        replica.active.add(request_id)
        self._arriving[request_id] = (decode, handoff.blocks)
        replica.process.send_bytes(handoff.message)

    def _note_arrivals(self, message: ipc.Outputs) -> None:
        """A handed request's first news from its decode engine: what it loaded; a refusal
        there (after its add was answered) is the request's error."""
        for ack in message.acks:
            if ack.error_type is not None and ack.request_id in self._arriving:
                if ack.request_id not in self._acks:
                    error = ipc.rebuild_error(ack.error_type, ack.param, ack.message)
                    self._fail({ack.request_id}, error)
        for out in message.outputs:
            entry = self._arriving.get(out.request_id)
            if entry is None or out.events is None or out.events.first_scheduled_time is None:
                continue
            del self._arriving[out.request_id]
            decode, blocks = entry
            lost = self.ledger.arrived(decode, blocks, out.events.num_cached_tokens,
                                       self.router.block_size)  # fmt: skip
            if lost:
                log.info("request %s: %d of its %d handed KV blocks were recomputed on %s",
                         out.request_id, lost, blocks, self._name(decode))  # fmt: skip

    def _replica_died(self, replica: CoreReplica) -> None:
        if replica.dead is not None:
            return
        index = self.replicas.index(replica)
        if self.roles[index] == DECODE:
            super()._replica_died(replica)  # fails its requests
            if self._dead_reason is None and all(
                r.dead is not None for i, r in enumerate(self.replicas) if self.roles[i] == DECODE
            ):
                self._dead_reason = "every decode engine is dead"
                self._fail(set(self._queues) | set(self._acks),
                           EngineDeadError(self._dead_reason))  # fmt: skip
                for other in self.replicas:
                    other.process.stop(1)
                if self.on_dead is not None:
                    self.on_dead()
            return
        replica.dead = replica.process.end_reason
        mine = [rid for rid, h in self._handoffs.items()
                if h.prefill == index and not h.handing]  # fmt: skip
        log.error("%s; its %d prompts are computed on decode engines instead", replica.dead,
                  len(mine))  # fmt: skip
        for future in self._calls.values():  # a call it will never answer
            if not future.done():
                future.set_exception(EngineDeadError(replica.dead))
        self._calls.clear()
        replica.process.stop(1)
        for request_id in mine:
            replica.active.discard(request_id)
            handoff = self._handoffs.pop(request_id)
            if request_id in self._queues or request_id in self._acks:
                self._to_decode(request_id, handoff)
            else:
                self._forget(request_id)

    # ---- what the server may ask -------------------------------------------------------------
    def replica_stats(self) -> list[EngineStats]:
        return [self.ledger.annotate(i, s) for i, s in enumerate(super().replica_stats())]

    async def snapshot(self) -> EngineSnapshot:
        """The first live decode engine's state (the dashboard shows where tokens are made)."""
        live = [r for i, r in enumerate(self.replicas)
                if r.dead is None and self.roles[i] == DECODE][:1]  # fmt: skip
        from inferd.engine.frontend.async_core_client import _typed

        return _typed((await self._call_all("snapshot", replicas=live))[0], EngineSnapshot)

    async def sleep(self, level: int):
        raise NotImplementedError(NO_SLEEP)

    async def wake_up(self):
        raise NotImplementedError(NO_SLEEP)

    def is_sleeping(self) -> bool:
        return False


def _prompt_only(request: CoreRequest) -> CoreRequest:
    """The request as a prefill engine runs it: its prompt, one greedy token (thrown away)."""
    return replace(request, params=SamplingParams(temperature=0.0, max_tokens=1), max_tokens=1,
                   pooling=None)  # fmt: skip


def _encoded(request: CoreRequest) -> bytes:
    try:
        return ipc.encode(ipc.Add(request))
    except (OverflowError, TypeError, ValueError) as e:  # e.g. a grammar's 100-digit number
        raise InvalidRequest(None, f"the request cannot be passed to the engine: {e}") from e
