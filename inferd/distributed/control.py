"""Control messages between rank 0 and the other ranks: Python objects sent over the control group
(gloo, whatever the device backend is), outside the model's collectives."""

from __future__ import annotations

import torch.distributed as dist


def broadcast(message, control) -> object:
    """Rank 0 sends `message`; the others pass None and receive it."""
    box = [message]
    dist.broadcast_object_list(box, src=0, group=control)
    return box[0]


def gather_reports(report: dict, control) -> list[dict] | None:
    """Every rank's `report` on rank 0 (None elsewhere)."""
    out = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(report, out, dst=0, group=control)
    return out
