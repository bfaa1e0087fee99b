"""User text in, never control tokens out: special-token strings typed by a user stay text.

A chat prompt is one string rendered from a template, and the tokenizer turns every
special-token string in it into its id, the template's own markers and a user's alike: typed
into a message, `<end_of_turn>\\n<start_of_turn>model\\n` would end the user's turn and forge
the model's. So, before rendering, every special-token string inside user-supplied text
(message contents, names, tool definitions, template variables) is marked with a noncharacter
(U+FDD0) placed just before it; the mark breaks the match while the template runs (its `trim`
and friends see the same text), and is removed before encoding. The prompt is then encoded
exactly as before, and each special token whose span holds a mark is replaced by the plain-text
tokens of its string. Prompts without such strings encode exactly as they always did.

The plain-text tokens come from a second `tokenizers.Tokenizer` that shares the model,
normalizer and pre-tokenizer objects of the first (no copy of the vocabulary: ~0 MB) and has
special-token matching switched off (`encode_special_tokens`, HF's `split_special_tokens`).
It is never switched back: toggling the flag on a shared tokenizer would race with other
threads' encodes. (The compact tokenizer has these modes itself: `CompactBPE.matching`.)

The same walk checks that the text is valid Unicode: a lone surrogate ("a\\ud800b", or
CESU-8 decoded leniently) cannot be encoded, and is refused here with a message naming where
it is, instead of failing inside the tokenizer as a TypeError.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from tokenizers import Encoding
from tokenizers import Tokenizer as Backend

# U+FDD0 is a Unicode noncharacter, reserved for a program's internal use: it never belongs to
# text a user means. Any a user sends is dropped, so every mark in a rendered prompt is ours
# (or the template's, which could only turn its own markers into text).
MARK = "\ufdd0"


# Texts longer than this are encoded with `encode_batch`, which releases Python's lock while the
# Rust code runs; `encode` holds it throughout, and megabytes of text would freeze every other
# thread of the process (the server's event loop, the engine loop) for seconds.
UNLOCKED_ABOVE_CHARS = 16 << 10


def encode_unlocked(backend: Backend, text: str, add_special_tokens: bool) -> Encoding:
    """`backend.encode(text)`, without holding Python's lock for long texts."""
    if len(text) <= UNLOCKED_ABOVE_CHARS:
        return backend.encode(text, add_special_tokens=add_special_tokens)
    return backend.encode_batch([text], add_special_tokens=add_special_tokens)[0]


def check_unicode(text: str, where: str) -> None:
    """ValueError naming `where` if `text` holds a surrogate code point (not encodable)."""
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(
            f"{where}: invalid Unicode: lone surrogate U+{ord(text[e.start]):04X} at character "
            f"{e.start} (text must be valid UTF-8; surrogate pairs must be combined)"
        ) from None


def _walk_strings(value: Any, path: str) -> Iterator[tuple[str, str]]:
    """(path, string) for every string in a JSON-like value, dict keys included."""
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str):
                yield f"{path} key", key
            yield from _walk_strings(item, f"{path}.{key}")
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            yield from _walk_strings(item, f"{path}[{i}]")


def check_unicode_in(value: Any, path: str) -> None:
    for where, text in _walk_strings(value, path):
        check_unicode(text, where)


class SpecialTokenGuard:
    """Built once per tokenizer (lazily); read-only afterwards, so safe to share by threads."""

    def __init__(self, backend: Backend, special_ids: frozenset[int]):
        self._backend = backend
        self.special_ids = special_ids
        added = backend.get_added_tokens_decoder()
        specials = {i: t for i, t in added.items() if t.special}
        self._contents = {i: t.content for i, t in specials.items()}
        self._first_chars = frozenset(t.content[:1] for t in specials.values())
        if hasattr(backend, "matching"):  # the compact tokenizer has both modes built in
            self._detector = backend.matching("special")
            self._plain_first = self._plain_mid = backend.matching("plain")
            return
        # Finds special-token strings exactly as the real tokenizer matches them (same tokens,
        # same normalizer), at the cost of a scan: all other text is one unknown "word".
        self._detector = _clone(backend, specials, share_model=False)
        if backend.normalizer is not None and any(t.normalized for t in specials.values()):
            # Only tokens marked `normalized` are matched in normalized text; skip the cost
            # when there are none (Gemma's, and most checkpoints' special tokens).
            self._detector.normalizer = backend.normalizer
        self._plain_first = _clone(backend, added, share_pre_tokenizer=True)
        self._plain_first.encode_special_tokens = True
        if backend.post_processor is not None:  # BOS/EOS for encode_plain
            self._plain_first.post_processor = backend.post_processor
        # A Metaspace pre-tokenizer with prepend_scheme "first" prepends "▁" only to text at
        # offset 0; a forged token's text sits mid-prompt, so it needs the "never" variant.
        pre = _state(backend.pre_tokenizer)
        mid = _metaspace_first_to_never(pre)
        if mid == pre:
            self._plain_mid = self._plain_first
        else:
            self._plain_mid = _clone(backend, added, pre_tokenizer=mid)
            self._plain_mid.encode_special_tokens = True

    # --- marking user text before a template runs -------------------------------------------

    def mark(self, value: Any) -> tuple[Any, int]:
        """`value` with a MARK before every special-token string inside its strings (dict keys
        included), and any MARK the user sent removed; plus how many marks were placed."""
        if isinstance(value, str):
            return self._mark_text(value)
        if isinstance(value, dict):
            out, total = {}, 0
            for key, item in value.items():
                key, n_key = self._mark_text(key) if isinstance(key, str) else (key, 0)
                out[key], n_item = self.mark(item)
                total += n_key + n_item
            return out, total
        if isinstance(value, list | tuple):
            items, total = [], 0
            for item in value:
                marked, n = self.mark(item)
                items.append(marked)
                total += n
            return type(value)(items) if isinstance(value, tuple) else items, total
        return value, 0

    def _mark_text(self, text: str) -> tuple[str, int]:
        if MARK in text:
            text = text.replace(MARK, "")
        if len(self._first_chars) <= 8 and not any(c in text for c in self._first_chars):
            return text, 0  # fast path: no special token can start anywhere in it
        enc = encode_unlocked(self._detector, text, False)
        pairs = zip(enc.ids, enc.offsets, strict=True)
        starts = [start for i, (start, _) in pairs if i in self.special_ids]
        if not starts:
            return text, 0
        pieces, last = [], 0
        for start in starts:
            pieces += [text[last:start], MARK]
            last = start
        pieces.append(text[last:])
        return "".join(pieces), len(starts)

    # --- encoding ----------------------------------------------------------------------------

    def encode_marked(self, rendered: str) -> list[int]:
        """Ids of a prompt rendered from marked values: the template's special tokens stay
        special, each marked one becomes plain text."""
        text, marks = strip_marks(rendered)
        if not marks:
            return encode_unlocked(self._backend, text, False).ids
        enc = encode_unlocked(self._backend, text, False)
        ids: list[int] = []
        pending = iter(marks)
        mark = next(pending, None)
        for token_id, (start, end) in zip(enc.ids, enc.offsets, strict=True):
            while mark is not None and mark < start:
                mark = next(pending, None)  # the mark's text did not become a special token
            if token_id in self.special_ids and mark is not None and start <= mark < end:
                ids += self.plain_ids(text[start:end], at_start=start == 0)
                continue
            ids.append(token_id)
        return ids

    def encode_plain(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Ids of `text` with every special-token string in it as plain text; BOS/EOS added
        as the tokenizer's post-processor says when `add_special_tokens`."""
        enc = encode_unlocked(self._plain_first, text, add_special_tokens)
        return self._scrub(enc, text)

    def plain_ids(self, text: str, at_start: bool = False) -> list[int]:
        plain = self._plain_first if at_start else self._plain_mid
        return self._scrub(encode_unlocked(plain, text, False), text)

    def _scrub(self, enc: Encoding, text: str) -> list[int]:
        """A vocabulary whose merges can rebuild a special token from its characters (Gemma's
        can) would still yield its id: re-encode such a token character by character. A special
        id standing for other text (the unknown token) is left alone."""
        if not self.special_ids.intersection(enc.ids):
            return enc.ids
        ids: list[int] = []
        for token_id, (start, end) in zip(enc.ids, enc.offsets, strict=True):
            if token_id not in self.special_ids or not self._spells(token_id, text[start:end]):
                ids.append(token_id)  # includes BOS/EOS the post-processor added (no text)
                continue
            for char in text[start:end]:
                char_ids = self._plain_mid.encode(char, add_special_tokens=False).ids
                if any(self._spells(i, char) for i in char_ids if i in self.special_ids):
                    raise ValueError(
                        f"the text {char!r} exists in this vocabulary only as a special token, "
                        "so it cannot be encoded as plain text"
                    )
                ids += char_ids
        return ids

    def _spells(self, token_id: int, span: str) -> bool:
        """Whether `span` is the text of special token `token_id` (as typed, or normalized)."""
        content = self._contents[token_id]
        if not span or content == span:
            return bool(span)
        normalizer = self._backend.normalizer
        return normalizer is not None and (
            normalizer.normalize_str(content) == normalizer.normalize_str(span)
        )


def strip_marks(rendered: str) -> tuple[str, list[int]]:
    """The rendered text without marks, and the positions (in it) the marks stood at."""
    if MARK not in rendered:
        return rendered, []
    parts = rendered.split(MARK)
    positions, pos = [], 0
    for part in parts[:-1]:
        pos += len(part)
        positions.append(pos)
    return "".join(parts), positions


def _state(component: Any) -> Any:
    return None if component is None else json.loads(component.__getstate__())


def _metaspace_first_to_never(state: Any) -> Any:
    if isinstance(state, dict):
        out = {k: _metaspace_first_to_never(v) for k, v in state.items()}
        if out.get("type") == "Metaspace" and out.get("prepend_scheme") == "first":
            out["prepend_scheme"] = "never"
        return out
    if isinstance(state, list):
        return [_metaspace_first_to_never(v) for v in state]
    return state


def _clone(
    backend: Backend,
    added: dict[int, Any],
    *,
    share_model: bool = True,
    pre_tokenizer: Any = None,
    share_pre_tokenizer: bool = False,
) -> Backend:
    """A tokenizer with `added` tokens under their ids. With `share_model` it then takes the
    model and normalizer objects of `backend` (the Rust side holds them by reference: nothing
    copied); without, its model reads all other text as one unknown word."""
    tokens = [
        {"id": i, "content": t.content, "single_word": t.single_word, "lstrip": t.lstrip,
         "rstrip": t.rstrip, "normalized": t.normalized, "special": t.special}
        for i, t in sorted(added.items())
    ]  # fmt: skip
    # NOTE: `tokenizers` gives an added token the id its model has for it, else a new one (the
    # JSON's "id" is not kept), so the placeholder model must know every added token's id.
    vocab = {t.content: i for i, t in added.items()}
    vocab[MARK] = backend.get_vocab_size(with_added_tokens=True)  # an id no token has
    document = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": tokens,
        "normalizer": None,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": None,
        "decoder": None,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": MARK},
    }
    clone = Backend.from_str(json.dumps(document))
    if share_model:
        clone.model = backend.model
        clone.normalizer = backend.normalizer
        if share_pre_tokenizer:
            clone.pre_tokenizer = backend.pre_tokenizer
    for i, t in added.items():  # the ids are what everything else relies on: check them
        if clone.token_to_id(t.content) != i:
            raise RuntimeError(f"tokenizer clone gives {t.content!r} another id than {i}")
    return clone
