"""After loading, a GGUF file's mapped pages leave the process's resident memory
(GGUFFile.release_pages; the engine calls it once its tokenizer and weights are loaded), and what
is read from the mapping afterwards is unchanged: the mapping is read-only, its pages come back
from the page cache."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from inferd.loader.default_model import default_model_path
from inferd.loader.gguf_file import GGUFFile

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/self/smaps")


def resident_kib(path) -> int:
    """This process's resident KiB of every mapping of `path`."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            fields = line.split()
            if "-" in fields[0] and len(fields) >= 5:  # a mapping's first line
                inside = len(fields) >= 6 and fields[5] == str(path)
            elif inside and fields[0] == "Rss:":
                total += int(fields[1])
    return total


def test_released_pages_leave_rss_and_read_back_the_same():
    path = default_model_path()
    gguf = GGUFFile(path)
    name = max(gguf.tensors, key=lambda n: gguf.tensors[n].n_bytes if "blk.0." in n else 0)
    before = gguf.raw(name).copy()  # touches the tensor's pages
    assert resident_kib(path) >= before.nbytes // 1024 // 2
    gguf.release_pages()
    assert resident_kib(path) == 0
    assert np.array_equal(gguf.raw(name), before)
    assert gguf.metadata["general.architecture"] == "gemma3"
