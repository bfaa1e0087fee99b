"""Links between devices, and what a tensor-parallel all-reduce costs over them.

Tensor parallelism splits every layer's matrices across N devices; each layer then sums its
attention output and its MLP output across them: two all-reduces a layer, each of
tokens x hidden activations (bf16 on a GPU). A ring all-reduce sends 2(N-1)/N of the data
through each device's link and takes 2(N-1) latency-bound hops:

    t = 2(N-1)/N x bytes / bandwidth + 2(N-1) x latency

Bandwidth is one direction of one device's link (a ring sends and receives at once). Latency
is a hop's fixed cost as collective libraries measure it at small sizes, the figure that rules
a decode step's small all-reduces.
"""

from __future__ import annotations

from dataclasses import dataclass

GB = 1e9


@dataclass(frozen=True)
class Interconnect:
    name: str
    description: str
    bandwidth_bytes_s: float  # per device, one direction
    latency_s: float  # per ring hop
    source: str
    across_nodes: bool = False


INTERCONNECTS: tuple[Interconnect, ...] = (
    Interconnect("nvlink4", "NVLink 4 (H100/H200 SXM, NVSwitch)", 450 * GB, 3e-6,
                 "NVIDIA H100 datasheet: NVLink 900 GB/s per GPU (both directions); hop "
                 "latency: NCCL small-message all-reduce figures, a few microseconds"),
    Interconnect("nvlink3", "NVLink 3 (A100 SXM, NVSwitch)", 300 * GB, 3e-6,
                 "NVIDIA A100 datasheet: NVLink 600 GB/s per GPU (both directions)"),
    Interconnect("pcie5", "PCIe gen 5 x16", 64 * GB, 8e-6,
                 "PCI-SIG PCIe 5.0: 32 GT/s x 16 lanes, about 64 GB/s each direction"),
    Interconnect("pcie4", "PCIe gen 4 x16", 32 * GB, 10e-6,
                 "PCI-SIG PCIe 4.0: 16 GT/s x 16 lanes, about 32 GB/s each direction"),
    Interconnect("ib-ndr", "InfiniBand NDR 400 Gb/s (across nodes)", 50 * GB, 15e-6,
                 "NVIDIA ConnectX-7 / Quantum-2 NDR: 400 Gb/s per port", across_nodes=True),
    Interconnect("ib-hdr", "InfiniBand HDR 200 Gb/s (across nodes)", 25 * GB, 15e-6,
                 "NVIDIA ConnectX-6 / Quantum HDR: 200 Gb/s per port", across_nodes=True),
    Interconnect("roce-400g", "RoCE v2 over 400 GbE (across nodes)", 50 * GB, 20e-6,
                 "IEEE 802.3 400GbE line rate; RoCE hop latency above InfiniBand's",
                 across_nodes=True),
    Interconnect("roce-100g", "RoCE v2 over 100 GbE (across nodes)", 12.5 * GB, 20e-6,
                 "IEEE 802.3 100GbE line rate", across_nodes=True),
    Interconnect("memory", "one socket's shared memory (CPU threads)", 0.0, 0.0,
                 "no link: the ranks of a CPU share its memory"),
)  # fmt: skip


def interconnect(name: str) -> Interconnect:
    for link in INTERCONNECTS:
        if link.name == name.lower():
            return link
    known = ", ".join(link.name for link in INTERCONNECTS)
    raise ValueError(f"unknown interconnect {name!r}; known: {known}")


def all_reduce_seconds(nbytes: float, devices: int, link: Interconnect) -> float:
    """Time of one ring all-reduce of `nbytes` over `devices` devices joined by `link`."""
    if devices <= 1 or link.bandwidth_bytes_s == 0:
        return 0.0
    hops = 2 * (devices - 1)
    return hops / devices * nbytes / link.bandwidth_bytes_s + hops * link.latency_s


def point_to_point_seconds(nbytes: float, link: Interconnect) -> float:
    """One send between pipeline stages."""
    if link.bandwidth_bytes_s == 0:
        return 0.0
    return nbytes / link.bandwidth_bytes_s + link.latency_s
