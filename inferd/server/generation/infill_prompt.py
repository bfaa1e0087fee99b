"""Fill-in-the-middle prompts, as token ids: what `/infill` and `suffix` on `/v1/completions`
send to the engine (run in a worker thread, like every tokenization).

The FIM tokens (`Tokenizer.fim`, inferd/tokenizer/fim.py) go in as their ids; the user's text
is tokenized without special-token parsing, so a `<|fim_middle|>` typed into code stays text.
The order is prefix, suffix, middle (PSM), as llama.cpp builds it:

    [BOS] [context files] <PRE> prefix <SUF> suffix <MID> prompt

and for Codestral, whose format has no middle token, Mistral's suffix-first order:
`[BOS] [SUFFIX] suffix [PREFIX] prefix prompt`. `prompt` is text the middle starts with
(llama.cpp's README: "added after the FIM_MID token"; editors send the cursor line's start).

Context files (`input_extra`: `{"filename", "text"}`) go first. A model with the repo-level
tokens (Qwen2.5-Coder, StarCoder2) gets the format it was trained with:
`<repo_name>NAME\\n` then `<file_sep>FILENAME\\n TEXT` per file, and `<file_sep>` before the
file being completed. Other models get each file as plain text (`--- FILENAME ---\\n TEXT\\n`)
before the FIM prompt: no tokens mark them, but the model still reads the code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from inferd.errors import InvalidRequest
from inferd.server.generation.prompts import checked_text

# Names the repo-level format needs where the request gives none (llama.cpp sends fixed
# placeholders too): the repository, and the file being completed.
REPO_NAME = "project"
CURRENT_FILE = "current"


@dataclass(frozen=True)
class ContextFile:
    filename: str
    text: str


def model_fim(tokenizer: Any, param: str) -> Any:
    """The model's FIM tokens (`Tokenizer.fim`, inferd/tokenizer/fim.py), or the 400 that says
    the model has none (naming `param`)."""
    fim = getattr(tokenizer, "fim", None)
    if fim is None:
        raise InvalidRequest(
            param,
            f"{param}: this model has no fill-in-the-middle tokens (such as <|fim_prefix|>, "
            "<fim_prefix>, <PRE> or [PREFIX], or GGUF tokenizer.ggml.fim_pre_token_id): serve a "
            "code model trained for infilling (Qwen2.5-Coder, StarCoder2, CodeLlama, "
            "DeepSeek-Coder, Codestral)",
        )
    return fim


def infill_ids(
    tokenizer: Any,
    fim: Any,
    prefix: str,
    suffix: str,
    prompt: str = "",
    files: list[ContextFile] | tuple[ContextFile, ...] = (),
    add_special_tokens: bool = True,
) -> list[int]:
    """The prompt's token ids (see the module's docstring for the layout)."""

    def text(s: str) -> list[int]:
        return tokenizer.encode(s, add_special_tokens=False, split_special_tokens=True) if s else []

    # The tokenizer's own leading specials (BOS where the model adds one), as for any prompt.
    ids = tokenizer.encode("", add_special_tokens=True) if add_special_tokens else []
    if files and fim.repo_level:
        ids += [fim.rep, *text(f"{REPO_NAME}\n")]
        for f in files:
            ids += [fim.sep, *text(f"{f.filename}\n{f.text}")]
        ids += [fim.sep, *text(f"{CURRENT_FILE}\n")]
    else:
        ids += [t for f in files for t in text(f"--- {f.filename} ---\n{f.text}\n")]
    if fim.suffix_first:
        return ids + [fim.suf, *text(suffix), fim.pre, *text(prefix + prompt)]
    middle = [] if fim.mid is None else [fim.mid]
    return ids + [fim.pre, *text(prefix), fim.suf, *text(suffix), *middle, *text(prompt)]


def suffix_prompts(
    tokenizer: Any, fim: Any, prompts: list[Any], suffix: str, add_special_tokens: bool
) -> list[dict[str, Any]]:
    """`/v1/completions` with OpenAI's `suffix`: each prompt is the prefix of a FIM prompt."""
    if any(not isinstance(p, str) for p in prompts):
        raise InvalidRequest("suffix", "suffix needs text prompts (not token ids)")
    checked(suffix, "suffix")
    return [
        {"prompt": None,
         "prompt_token_ids": infill_ids(tokenizer, fim, checked(p, "prompt"), suffix,
                                        add_special_tokens=add_special_tokens)}
        for p in prompts
    ]  # fmt: skip


def checked(text: str, param: str) -> str:
    """Text a tokenizer can take (no lone surrogates)."""
    return checked_text(param, text)
