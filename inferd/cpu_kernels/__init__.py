"""inferd's own CPU kernels, in C: compiled per ISA variant (variants.py) with the machine's C
compiler, the best one the CPU runs loaded at engine start-up (startup.py), and called through
ctypes. See build.py."""

from inferd.cpu_kernels.build import (
    Kernels,
    KernelsUnavailable,
    current_kernels,
    kernel_library,
    kernels_available,
)

__all__ = ["Kernels", "KernelsUnavailable", "current_kernels", "kernel_library",
           "kernels_available"]  # fmt: skip
