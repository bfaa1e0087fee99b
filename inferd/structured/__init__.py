"""Structured outputs: replies constrained to a JSON schema, regex, choice list or grammar.

    request_fields.py  response_format / structured_outputs / guided_* -> one spec
    tokenizer_info.py  the model's vocabulary as llguidance sees it, built once, cached on disk
    grammar.py         spec -> llguidance grammar text
    manager.py         GrammarManager: compiles off the caller's thread, caches by spec
    matcher.py         GrammarMatcher: one sequence's parser state (accept, rollback, bitmask)
    bitmask.py         the int32 bitmask rows and applying them to logits rows
    sampling.py        check-first sampling: mask a row only when its sampled token is rejected
    benchmark.py       per-token costs on the embedded model (python -m inferd.structured.benchmark)

The request's spec, StructuredOutputsParams, and InvalidGrammarError live in
inferd/structured_params.py (the bottom row: the HTTP layer and SamplingParams validate specs
without importing torch or llguidance); they are re-exported here. The engine's side (waiting for
grammars, matchers per sequence, constrained sampling) is
inferd/engine/sampling/structured_outputs.py.
"""

from inferd.structured_params import InvalidGrammarError, StructuredOutputsParams

__all__ = ["InvalidGrammarError", "StructuredOutputsParams"]
