"""A model's fill-in-the-middle (FIM) tokens: which ids mark the prefix, the suffix and the
middle of a code-completion prompt, and the repo-level tokens (repository name, file separator)
some models were also trained with.

They come from the GGUF file's metadata when it names them (llama.cpp's keys
`tokenizer.ggml.fim_pre_token_id` ... `fim_sep_token_id`), else from the vocabulary by the
names each family uses. A model with none of the families' sets has no FIM (`fim_tokens` is
None); the server then answers FIM requests with a 400 that says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# The roles, and the GGUF metadata key of each (llama.cpp writes these for FIM models).
ROLES = ("pre", "suf", "mid", "pad", "rep", "sep")
GGUF_KEYS = {role: f"tokenizer.ggml.fim_{role}_token_id" for role in ROLES}

# Token names per family, in the order the roles above list them ("" where a family has no such
# token). First match wins; a family needs its prefix and suffix tokens in the vocabulary.
_FAMILIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("qwen", ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|fim_pad|>",
              "<|repo_name|>", "<|file_sep|>")),  # Qwen2.5-Coder, CodeGemma (no repo tokens)
    ("starcoder", ("<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<fim_pad>",
                   "<repo_name>", "<file_sep>")),  # StarCoder(2), SantaCoder
    ("deepseek", ("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>", "", "", "")),
    ("codellama", ("▁<PRE>", "▁<SUF>", "▁<MID>", "", "", "")),  # HF's names of the tokens
    ("codellama", ("<PRE>", "<SUF>", "<MID>", "", "", "")),  # llama.cpp's GGUF names
    ("codestral", ("[PREFIX]", "[SUFFIX]", "", "", "", "")),
)  # fmt: skip


@dataclass(frozen=True)
class FIMTokens:
    pre: int
    suf: int
    mid: int | None  # None: the family has no middle token (Codestral)
    pad: int | None = None
    rep: int | None = None  # repository name (repo-level format)
    sep: int | None = None  # file separator (repo-level format)
    # Codestral's order (Mistral's documented format): [SUFFIX]suffix[PREFIX]prefix, then the
    # middle; every other family takes prefix, suffix, middle (PSM).
    suffix_first: bool = False

    @property
    def repo_level(self) -> bool:
        """Whether context files can be given in the repo-level format."""
        return self.rep is not None and self.sep is not None


def gguf_fim_ids(metadata: dict[str, Any], vocab_size: int) -> dict[str, int]:
    """The FIM ids a GGUF file's metadata names (ids outside the vocabulary are left out)."""
    ids = {}
    for role, key in GGUF_KEYS.items():
        value = metadata.get(key)
        if value is not None and 0 <= int(value) < vocab_size:
            ids[role] = int(value)
    return ids


def fim_tokens(tokenizer: Any) -> FIMTokens | None:
    """The tokenizer's FIM tokens: the GGUF metadata's (`tokenizer.fim_token_ids`) when they
    name a prefix and a suffix, else the first family whose names are in the vocabulary."""
    given = getattr(tokenizer, "fim_token_ids", None) or {}
    if "pre" in given and "suf" in given:
        codestral = _name(tokenizer, given["pre"]) == "[PREFIX]"
        return FIMTokens(**{r: given.get(r) for r in ROLES}, suffix_first=codestral)
    to_id = getattr(tokenizer, "token_to_id", None)
    if to_id is None:  # an engine client's tokenizer that cannot look names up
        return None
    for family, names in _FAMILIES:
        ids = {role: to_id(name) if name else None for role, name in zip(ROLES, names)}
        if ids["pre"] is not None and ids["suf"] is not None:
            return FIMTokens(**ids, suffix_first=family == "codestral")
    return None


def _name(tokenizer: Any, token_id: int) -> str | None:
    convert = getattr(tokenizer, "convert_ids_to_tokens", None)
    return convert([token_id])[0] if convert else None
