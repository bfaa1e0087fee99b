"""The engine core: one step (EngineCore), the loop that drives it (CoreLoop) and what it
reports."""
