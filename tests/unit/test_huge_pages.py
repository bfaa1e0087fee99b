"""Moving mapped weights into huge pages keeps every address and every byte (huge_pages.py)."""

from __future__ import annotations

import mmap
import os
import sys

import pytest
import torch

from inferd.commands import doctor
from inferd.loader import huge_pages

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mremap is Linux's")


def _mapped_file(tmp_path, size: int) -> tuple[mmap.mmap, bytes]:
    data = os.urandom(size)
    path = tmp_path / "entry.bin"
    path.write_bytes(data)
    with open(path, "rb") as f:
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY), data


def _backing(address: int) -> str:
    """The path (or '' for anonymous memory) of the mapping holding `address`."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            if lo <= address < hi:
                return fields[5] if len(fields) > 5 else ""
    raise AssertionError(f"{address:#x} is not mapped")


@linux_only
def test_moved_memory_keeps_its_addresses_and_bytes(tmp_path, monkeypatch):
    monkeypatch.setattr(huge_pages, "CHUNK", huge_pages.HUGE_PAGE)  # several moves
    mapped, data = _mapped_file(tmp_path, 5 * huge_pages.HUGE_PAGE + 12345)
    tensor = torch.frombuffer(mapped, dtype=torch.uint8)  # a pointer taken before the move
    address = tensor.data_ptr()
    first = -(-address // huge_pages.HUGE_PAGE) * huge_pages.HUGE_PAGE
    last = (address + len(data)) // huge_pages.HUGE_PAGE * huge_pages.HUGE_PAGE
    assert _backing(first).endswith("entry.bin")

    assert huge_pages.move_into_huge_pages(mapped) == last - first >= 4 * huge_pages.HUGE_PAGE
    assert tensor.data_ptr() == address and bytes(tensor.numpy()) == data
    assert mapped[:] == data
    assert _backing(first) == "" and _backing(last - 1) == ""  # the file no longer backs it
    del tensor
    mapped.close()


def test_nothing_moves_when_switched_off(tmp_path, monkeypatch):
    monkeypatch.setenv("INFERD_HUGE_PAGES", "0")
    mapped, data = _mapped_file(tmp_path, 2 * huge_pages.HUGE_PAGE)
    assert not huge_pages.enabled()
    assert huge_pages.start_moving(mapped, "entry") is None and mapped[:] == data
    mapped.close()


@linux_only
def test_a_mapping_moved_in_a_thread_reads_the_same_throughout(tmp_path, monkeypatch):
    monkeypatch.setenv("INFERD_HUGE_PAGES", "1")
    monkeypatch.setattr(huge_pages, "enabled", lambda: True)  # whatever this OS's setting
    mapped, data = _mapped_file(tmp_path, 3 * huge_pages.HUGE_PAGE)
    view = torch.frombuffer(mapped, dtype=torch.uint8)
    expected = int(view.sum())
    thread = huge_pages.start_moving(mapped, "entry")
    sums = [int(view.sum()) for _ in range(20)]  # read while the thread moves
    thread.join()
    assert sums == [expected] * 20 and bytes(view.numpy()) == data
    del view
    mapped.close()


@linux_only
@pytest.mark.parametrize(
    "thp, overcommit, reason",
    [
        ("always [madvise] never", "0", None),
        ("always madvise [never]", "0", "are off"),
        ("[always] madvise never", "2", "strict overcommit"),
    ],
)
def test_moving_needs_huge_pages_on_and_memory_not_strictly_accounted(
    tmp_path, monkeypatch, thp, overcommit, reason
):
    monkeypatch.delenv("INFERD_HUGE_PAGES", raising=False)
    (tmp_path / "enabled").write_text(thp + "\n")
    (tmp_path / "overcommit").write_text(overcommit + "\n")
    monkeypatch.setattr(huge_pages, "_THP_SETTING", tmp_path / "enabled")
    monkeypatch.setattr(huge_pages, "_OVERCOMMIT", tmp_path / "overcommit")
    assert huge_pages.enabled() is (reason is None)
    why = huge_pages.why_not()
    assert why is None if reason is None else reason in why
    fact = doctor.collect()["weights in huge pages"]  # what `inferd doctor` prints
    assert fact == ("yes, after load" if reason is None else f"no: {why}")
