"""Named hardware for `inferd plan --hardware NAME`: the published limits of common accelerators
and CPU sockets, each figure with its public source.

Figures are the vendors' peak numbers (dense, no sparsity): memory capacity, memory bandwidth,
matrix throughput by precision, board power. What a real step reaches is less: `achievable` in
roofline.py applies the same stated fractions to every profile (a profile is never tuned to a
measurement), and `--hardware this` measures this machine instead (machine_peaks.py).

Precision keys as machine_peaks.py names them: "bfloat16" (and "float16", the same rate on these
parts), "fp8", "int8", "float32";
a precision a part has no matrix unit for is absent (A100: no fp8), and the planner then runs
it at the bf16 rate after dequantisation (weight-only quantisation: int4 reads fewer bytes but
computes in bf16).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from inferd.plan.machine_peaks import MachinePeaks

TB, GB, GIB = 1e12, 1e9, 2**30
TFLOPS = 1e12


@dataclass(frozen=True)
class HardwareProfile:
    name: str  # the key of --hardware
    description: str
    kind: str  # "gpu" or "cpu"
    memory_bytes: int
    memory_bandwidth_bytes_s: float
    flops_s: dict[str, float]  # peak dense matrix throughput by precision
    tdp_watts: float  # board power (GPU) or socket TDP (CPU)
    interconnect: str  # the default link between devices of a node (interconnects.py)
    source: str  # where the figures come from (public documents)
    cores: int = 0  # CPU cores (0 for a GPU)
    notes: str = ""
    aliases: tuple[str, ...] = field(default=())

    def peaks(self) -> MachinePeaks:
        """The same limits in the record `--hardware this` measures."""
        return MachinePeaks(
            name=self.description,
            cores=self.cores,
            memory_bytes=self.memory_bytes,
            memory_bandwidth_bytes_s=self.memory_bandwidth_bytes_s,
            flops_s=dict(self.flops_s),
        )


def _gpu(name, description, memory_gib, bandwidth, bf16, fp8, int8, tdp, link, source,
         notes="", aliases=()) -> HardwareProfile:  # fmt: skip
    flops = {"bfloat16": bf16 * TFLOPS, "float16": bf16 * TFLOPS, "float32": bf16 * TFLOPS / 2}
    if fp8:
        flops["fp8"] = fp8 * TFLOPS
    if int8:
        flops["int8"] = int8 * TFLOPS
    return HardwareProfile(name, description, "gpu", int(memory_gib * GIB), bandwidth, flops,
                           tdp, link, source, notes=notes, aliases=aliases)  # fmt: skip


# NOTE: "fp32" for a GPU is TF32 on its tensor cores (half the bf16 rate on these parts), what
# a float32 matmul runs at with TF32 allowed; memory is the marketed GB read as GiB only where
# the part really has 2^30-byte units (HBM stacks: 80 GB means 80 GiB of cells, ~79.6 usable).
PROFILES: tuple[HardwareProfile, ...] = (
    _gpu("h100-sxm", "NVIDIA H100 SXM5 80GB", 80, 3.35 * TB, 989, 1979, 1979, 700, "nvlink4",
         "NVIDIA H100 Tensor Core GPU datasheet (SXM5 column: 3.35 TB/s HBM3, BF16 989 TFLOPS "
         "dense, FP8 1979 TFLOPS dense, up to 700 W, NVLink 900 GB/s)", aliases=("h100",)),
    _gpu("h100-pcie", "NVIDIA H100 PCIe 80GB", 80, 2.0 * TB, 756, 1513, 1513, 350, "pcie5",
         "NVIDIA H100 Tensor Core GPU datasheet (PCIe column: 2.0 TB/s HBM2e, BF16 756 TFLOPS "
         "dense, FP8 1513 TFLOPS dense, 300-350 W, PCIe Gen5 128 GB/s)"),
    _gpu("h200", "NVIDIA H200 SXM 141GB", 141, 4.8 * TB, 989, 1979, 1979, 700, "nvlink4",
         "NVIDIA H200 Tensor Core GPU datasheet (SXM column: 141 GB HBM3e, 4.8 TB/s, BF16 989 "
         "TFLOPS dense, FP8 1979 TFLOPS dense, up to 700 W, NVLink 900 GB/s)",
         aliases=("h200-sxm",)),
    _gpu("a100-40gb", "NVIDIA A100 SXM4 40GB", 40, 1.555 * TB, 312, 0, 624, 400, "nvlink3",
         "NVIDIA A100 Tensor Core GPU datasheet (40GB SXM: 1,555 GB/s HBM2, BF16 312 TFLOPS "
         "dense, INT8 624 TOPS, 400 W, NVLink 600 GB/s); no FP8 tensor cores",
         aliases=("a100-40",)),
    _gpu("a100-80gb", "NVIDIA A100 SXM4 80GB", 80, 2.039 * TB, 312, 0, 624, 400, "nvlink3",
         "NVIDIA A100 Tensor Core GPU datasheet (80GB SXM: 2,039 GB/s HBM2e, BF16 312 TFLOPS "
         "dense, INT8 624 TOPS, 400 W, NVLink 600 GB/s); no FP8 tensor cores",
         aliases=("a100", "a100-80")),
    _gpu("l40s", "NVIDIA L40S 48GB", 45, 864 * GB, 362, 733, 733, 350, "pcie4",
         "NVIDIA L40S datasheet (48 GB GDDR6 with ECC, 864 GB/s, BF16 362.05 TFLOPS dense "
         "(733 with sparsity), FP8 733 TFLOPS dense, 350 W, PCIe Gen4 x16)",
         notes="GDDR6: 48 GB decimal, about 44.7 GiB"),
    _gpu("rtx-4090", "NVIDIA GeForce RTX 4090 24GB", 22.35, 1008 * GB, 165, 330, 660, 450,
         "pcie4",
         "NVIDIA Ada Lovelace architecture whitepaper, RTX 4090 column (1008 GB/s GDDR6X, FP16 "
         "tensor with FP32 accumulate 165.2 TFLOPS dense, FP8 330.3 dense, INT8 660.6 dense, "
         "450 W TGP, PCIe Gen4 x16)", notes="24 GB decimal GDDR6X, about 22.35 GiB",
         aliases=("4090",)),
    _gpu("rtx-4060-laptop", "NVIDIA GeForce RTX 4060 Laptop 8GB", 7.45, 256 * GB, 24.6, 49, 98,
         115, "pcie4",
         "NVIDIA GeForce RTX 4060 Laptop GPU specifications (8 GB GDDR6, 128-bit, 16 Gbps: "
         "256 GB/s; 24 SMs at up to 2.37 GHz boost; 35-115 W TGP); tensor rates scaled from the "
         "Ada whitepaper's per-SM rate (RTX 4090: 165.2 TFLOPS over 128 SMs at 2.52 GHz) to 24 "
         "SMs at 2.0 GHz sustained", notes="derived tensor rates; TGP set by the laptop maker",
         aliases=("4060-laptop",)),
    HardwareProfile(
        "epyc-ddr5", "AMD EPYC 9654 socket, 12 x DDR5-4800", "cpu", 384 * GIB, 460.8 * GB,
        {"float32": 7.37 * TFLOPS, "bfloat16": 14.7 * TFLOPS, "int8": 29.5 * TFLOPS}, 360, "pcie5",
        "AMD EPYC 9654 product page (96 cores, 2.4 GHz base, 12 DDR5-4800 channels, 360 W "
         "default TDP); bandwidth 12 channels x 4800 MT/s x 8 B = 460.8 GB/s; Zen 4 runs two "
        "256-bit FMAs per cycle (32 fp32 FLOP/cycle/core; AVX512_BF16 and VNNI double and "
        "quadruple it) at base clock",
        cores=96, notes="384 GiB: 12 x 32 GiB DIMMs, a common fit", aliases=("epyc",)),
    HardwareProfile(
        "xeon-ddr5", "Intel Xeon Platinum 8480+ socket, 8 x DDR5-4800", "cpu", 512 * GIB,
        307.2 * GB,
        {"float32": 7.17 * TFLOPS, "bfloat16": 114.7 * TFLOPS, "int8": 229.4 * TFLOPS}, 350,
        "pcie5",
        "Intel Xeon Platinum 8480+ product specification (56 cores, 2.0 GHz base, 8 DDR5-4800 "
        "channels, 350 W TDP); bandwidth 8 x 4800 MT/s x 8 B = 307.2 GB/s; AVX-512: two FMA "
        "units (64 fp32 FLOP/cycle/core); AMX: 1024 bf16 and 2048 int8 ops/cycle/core, at base "
        "clock",
        cores=56, notes="512 GiB: 8 x 64 GiB DIMMs, a common fit", aliases=("xeon",)),
)  # fmt: skip


def known_names() -> list[str]:
    return [p.name for p in PROFILES]


def profile(name: str) -> HardwareProfile:
    """The profile called `name` (or one of its aliases); a ValueError lists the known ones."""
    key = name.strip().lower().replace("_", "-").replace(" ", "-")
    for p in PROFILES:
        if key == p.name or key in p.aliases:
            return p
    raise ValueError(
        f"unknown hardware {name!r}; known: this (measure this machine), "
        + ", ".join(known_names())
    )
