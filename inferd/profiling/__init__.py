"""Where the time goes: the engine's always-on step timer (`step_timer.py`) and, on request, a
`torch.profiler` trace with inferd's named ranges (`trace.py`, `instrument.py`). See
docs/profiling.md."""
