"""Leaving the process group ends its threads there and then, not at interpreter exit: a
collective's clean-up still running on one of them while Python shut down aborted the process
(`launch.leave_group`)."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

from inferd.distributed.control import broadcast
from inferd.distributed.launch import end_rendezvous, join_group, leave_group, local_rendezvous


def _threads() -> set[str]:
    return set(os.listdir(f"/proc/{os.getpid()}/task"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="lists threads through /proc")
def test_leaving_the_group_joins_its_threads():
    before = _threads()
    init = local_rendezvous()
    tp, control = join_group(0, 1, init, torch.device("cpu"), 30)
    end_rendezvous(init)
    assert _threads() - before  # gloo runs threads of its own
    broadcast(("stop",), control)  # the last message, as an engine's shutdown sends it
    del control
    leave_group(tp)
    assert not dist.is_initialized() and tp.group is None
    assert _threads() - before == set()
