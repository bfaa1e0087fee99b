"""The KV tiers an engine's flags ask for, checked and opened at start-up:

    --kv-offload-memory BYTES                  a RAM tier (shared memory, the server's replicas
                                               share it, gone when the server stops)
    --kv-offload-dir DIR --kv-offload-disk BYTES
                                               a disk tier (shared too, and it outlives the
                                               process: the next start of the same model finds
                                               its blocks)

A flag that cannot work is refused here, before the model loads, with what to do instead."""

from __future__ import annotations

from pathlib import Path

from inferd.config import EngineConfig
from inferd.engine.kv_tiers.block_store import BlockStore
from inferd.engine.kv_tiers.connector import (
    KVConnector,
    memory_tier_root,
    remove_orphaned_memory_tiers,
    store_identity,
)


def wants_tiers(config: EngineConfig) -> bool:
    return bool(config.kv_offload_memory or config.kv_offload_dir or config.kv_offload_disk)


def check_tier_flags(config: EngineConfig) -> None:
    """Refuse tier flags that would do nothing or cannot work (before anything loads)."""
    for name in ("kv_offload_memory", "kv_offload_disk"):
        value = getattr(config, name)
        if value is not None and (not isinstance(value, int) or value <= 0):
            raise ValueError(f"{name} must be a positive number of bytes, got {value!r}")
    if (config.kv_offload_dir is None) != (config.kv_offload_disk is None):
        raise ValueError("the disk KV tier needs both --kv-offload-dir DIR and "
                         "--kv-offload-disk BYTES (its bound)")  # fmt: skip
    if not wants_tiers(config):
        return
    if not config.enable_prefix_caching:
        raise ValueError("KV tiers keep blocks by their prefix-cache names: they need prefix "
                         "caching (drop --no-enable-prefix-caching)")  # fmt: skip
    if config.tensor_parallel_size > 1:
        raise ValueError("KV tiers with --tensor-parallel-size > 1 are not supported: each rank "
                         "holds a slice of every block")  # fmt: skip


def open_connector(config: EngineConfig, runner, hash_root: bytes, weights: tuple[int, int],
                   version: str, owner_pid: int) -> KVConnector | None:  # fmt: skip
    """The connector over the configured tiers (RAM first), or None without any. `weights`:
    the weight files' (bytes, mtime); `owner_pid`: the server process whose RAM tier this is."""
    if not wants_tiers(config):
        return None
    identity = store_identity(hash_root, weights, runner.kv_layout(), version)
    payload = runner.block_bytes()
    stores = []
    if config.kv_offload_memory:
        remove_orphaned_memory_tiers()
        stores.append(BlockStore("memory", memory_tier_root(owner_pid), identity,
                                 config.kv_offload_memory, payload))  # fmt: skip
    if config.kv_offload_dir:
        root = Path(config.kv_offload_dir).expanduser()
        stores.append(BlockStore("disk", root, identity, config.kv_offload_disk, payload))
    return KVConnector(stores)
