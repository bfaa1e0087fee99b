"""Named ranges in a trace, installed on one engine's objects while its trace runs and removed
when it stops, so that a run without a trace executes none of this code:

* the step and its phases (`EngineRanges`, driven by the engine's StepTimer);
* every decoder layer (`layer.N`), the embedding, the final norm and the LM head (forward
  hooks), and each layer of the C decoder, which runs layers without their forward;
* every call into inferd's C kernels, under the kernel's own name (`inferd_block_gemv`, ...):
  the objects of this engine that hold the kernel library get a proxy that opens a range
  around each call.

The ranges are `torch.profiler.record_function`, looked up when the trace starts.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

_MISSING = object()


class Patches:
    """Attributes replaced on objects, and put back (in reverse order) by `restore`."""

    def __init__(self) -> None:
        self._undo: list[Callable[[], None]] = []

    def set(self, obj: Any, name: str, value: Any) -> None:
        before = vars(obj).get(name, _MISSING)
        setattr(obj, name, value)
        if before is _MISSING:  # it came from the class: deleting the instance copy restores it
            self._undo.append(lambda: delattr(obj, name))
        else:
            self._undo.append(lambda: setattr(obj, name, before))

    def add(self, undo: Callable[[], None]) -> None:
        self._undo.append(undo)

    def restore(self) -> None:
        while self._undo:
            self._undo.pop()()


class EngineRanges:
    """The step range and, inside it, one range per phase (the StepTimer's `ranges`)."""

    def __init__(self, record_function: Callable[[str], Any]):
        self._record = record_function
        self._open: list[Any] = []  # [step range, phase range]

    def _enter(self, name: str) -> None:
        rf = self._record(name)
        rf.__enter__()
        self._open.append(rf)

    def start_step(self) -> None:
        self.end_step()  # a step that raised left its ranges open
        self._enter("inferd.step")
        self._enter("inferd.schedule")

    def switch(self, phase: str) -> None:
        if len(self._open) == 2:
            self._open.pop().__exit__(None, None, None)
        self._enter(f"inferd.{phase}")

    def end_step(self) -> None:
        while self._open:
            self._open.pop().__exit__(None, None, None)


class TracedKernels:
    """A stand-in for a loaded kernel library whose `inferd_*` functions run inside a range
    named after them."""

    def __init__(self, lib: ctypes.CDLL, record_function: Callable[[str], Any]):
        self._lib, self._record = lib, record_function

    def __getattr__(self, name: str) -> Any:
        function = getattr(self._lib, name)
        if not name.startswith("inferd_"):
            return function
        record = self._record

        def call(*args: Any) -> Any:
            with record(name):
                return function(*args)

        self.__dict__[name] = call  # found without __getattr__ from now on
        return call


def instrument_model(runner: Any, record_function: Callable[[str], Any]) -> Patches:
    """Ranges around the layers of `runner.model` and the kernel calls of this engine's
    objects. Returns what `restore()` undoes."""
    patches = Patches()
    model: nn.Module = runner.model
    body = getattr(model, "model", None)
    named: list[tuple[str, nn.Module | None]] = [
        ("embedding", getattr(body, "embed_tokens", None)),
        *((f"layer.{i}", layer) for i, layer in enumerate(getattr(body, "layers", ()))),
        ("final_norm", getattr(body, "norm", None)),
        ("lm_head", getattr(model, "lm_head", None)),
    ]
    for name, module in named:
        if module is not None:
            _range_hooks(module, name, record_function, patches)
    decoder = getattr(model, "cpu_decoder", None)
    if decoder is not None:
        run_layer = decoder.run_layer

        def traced_layer(index: int, *args: Any) -> None:
            with record_function(f"layer.{index}"):
                run_layer(index, *args)

        patches.set(decoder, "run_layer", traced_layer)
        patches.set(decoder, "layer_by_layer", True)  # one C call per layer while traced
    _trace_kernels([*model.modules(), decoder, runner.backend], record_function, patches)
    return patches


def _range_hooks(module: nn.Module, name: str, record_function, patches: Patches) -> None:
    stack: list[Any] = []

    def before(_module, _args) -> None:
        rf = record_function(name)
        rf.__enter__()
        stack.append(rf)

    def after(_module, _args, _out) -> None:
        if stack:
            stack.pop().__exit__(None, None, None)

    for handle in (module.register_forward_pre_hook(before), module.register_forward_hook(after)):
        patches.add(handle.remove)


def _trace_kernels(holders: list[Any], record_function, patches: Patches) -> None:
    """Replace every kernel library an object of this engine holds by a TracedKernels."""
    from inferd.cpu_kernels import kernel_library, kernels_available
    from inferd.layers.gguf_blocks import BlockWeight

    proxies: dict[int, TracedKernels] = {}

    def proxy(lib: ctypes.CDLL) -> TracedKernels:
        if id(lib) not in proxies:
            proxies[id(lib)] = TracedKernels(lib, record_function)
        return proxies[id(lib)]

    for obj in holders:
        if obj is None:
            continue
        for name, value in list(vars(obj).items()):
            if isinstance(value, ctypes.CDLL):
                patches.set(obj, name, proxy(value))
        # A block weight looks its library up at its first product, which may be inside the
        # trace: give it the (traced) library now.
        if isinstance(obj, BlockWeight) and obj.lib is None and kernels_available():
            patches.set(obj, "lib", proxy(kernel_library()))


def record_function() -> Callable[[str], Any]:
    """torch's named-range context manager, looked up now (tests replace it)."""
    return torch.profiler.record_function
