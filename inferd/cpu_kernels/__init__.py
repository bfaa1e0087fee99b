"""inferd's own CPU kernels, in C: built on first use with the machine's C compiler, for this
CPU (`-march=native`), and called through ctypes. See build.py."""

from inferd.cpu_kernels.build import KernelsUnavailable, kernel_library, kernels_available

__all__ = ["KernelsUnavailable", "kernel_library", "kernels_available"]
