"""Incremental detokenization: turning a stream of generated ids into a stream of text deltas.

Decoding token by token and concatenating is wrong: SentencePiece decoders drop or add spaces
depending on a token's neighbours, and a character can span several tokens (byte-fallback
tokens `<0xE2><0x82><0xAC>` are one "€"; a byte-level token can end mid-character). So each
step decodes a small window (a few tokens of already-emitted context, then the tokens not yet
emitted) and emits what lies beyond the text of the context part. Text is only
released when it is final: never a trailing U+FFFD from an unfinished character, and never in
the middle of a run of byte-fallback tokens, because the decoder turns a whole run into U+FFFDs
if any byte of it is invalid, retroactively. Then the deltas add up to `decode(output_ids)`.
(One deliberate exception: decoders that strip the first leading space, as Llama's
SentencePiece does, keep the space after the prompt in the stream, where a lone
`decode(output_ids)` drops it.)
"""

from __future__ import annotations

from inferd.tokenizer.tokenizer import Tokenizer

REPLACEMENT_CHAR = "\ufffd"
# Already-emitted tokens decoded again as context for the next ones (whether a token's leading
# space shows can depend on what precedes it).
CONTEXT_TOKENS = 5
# NOTE: bounds the window, hence the cost of a step. Valid text never needs it: a character
# is at most 4 bytes, and byte-fallback runs are short. Only a degenerate stream (dozens of
# tokens without a complete character) is released early, as decoded so far.
MAX_PENDING_TOKENS = 32
# After emitting, the window goes on as the next step's context (its text is already decoded,
# so one decode per step, not two) until it holds this many ids; then it starts afresh from
# the last emitted ones. NOTE: a decode costs tens of microseconds on the server's event loop,
# where each token arrives just after a forward pass evicted the caches.
MAX_WINDOW_TOKENS = 12


class IncrementalDetokenizer:
    """Feed generated ids with `step`; read deltas back. `flush` releases held-back text."""

    def __init__(
        self, tokenizer: Tokenizer, prompt_ids: list[int], skip_special_tokens: bool = True
    ):
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self._byte_ids = tokenizer.byte_fallback_ids
        # Skipped tokens vanish before decoding, so they do not end a byte run: bytes on both
        # sides of one join up. NOTE: both checks below look through them for that reason.
        # NOTE: the tokenizer's one shared set, not a copy per sequence (6,249 ids for Gemma).
        self._hidden = tokenizer.special_ids if skip_special_tokens else frozenset()
        self._chunks: list[str] = []
        # NOTE: `_ids` holds only the window: `_ids[:_read_offset]` is context already emitted
        # (its text is `_prefix_text`), the rest is pending. Older ids are dropped.
        self._ids: list[int] = []
        self._read_offset = 0
        self._prefix_text = ""
        self._start_window(list(prompt_ids))

    def step(self, new_token_ids: list[int]) -> str:
        """Add generated ids; return the text that became final (often "", never a broken
        character)."""
        if not new_token_ids:
            return ""
        self._ids.extend(new_token_ids)
        pending = len(self._ids) - self._read_offset
        text = self._decode(self._ids)
        final = self._is_final(text)
        if pending <= MAX_PENDING_TOKENS and not final:
            return ""
        return self._advance(text, final)

    def flush(self) -> str:
        """Release whatever is held back (call once the request finishes)."""
        if len(self._ids) == self._read_offset:
            return ""
        return self._advance(self._decode(self._ids), final=False)

    @property
    def text(self) -> str:
        """All text emitted so far."""
        if len(self._chunks) > 1:
            self._chunks = ["".join(self._chunks)]
        return self._chunks[0] if self._chunks else ""

    def _is_final(self, text: str) -> bool:
        if not self._ends_cleanly(self._ids, text):
            return False
        # Nothing visible yet (e.g. skipped special tokens): keep the context window as is, so
        # a following token still sees real text before it.
        return len(text) > len(self._prefix_text)

    def _ends_cleanly(self, ids: list[int], text: str) -> bool:
        last = next((i for i in reversed(ids) if i not in self._hidden), None)
        if last in self._byte_ids:
            return False  # the run may continue, and a later byte can change all of it
        # A trailing U+FFFD is most likely a character whose other bytes are still to come.
        return not text.endswith(REPLACEMENT_CHAR)

    def _advance(self, text: str, final: bool) -> str:
        """Emit what `text` (the window's) holds beyond the context. `final`: it ends cleanly,
        so the whole window can be the next context as it is."""
        delta = text[len(self._prefix_text) :]
        if delta:
            self._chunks.append(delta)
        if final and len(self._ids) < MAX_WINDOW_TOKENS:
            self._read_offset, self._prefix_text = len(self._ids), text
        else:
            self._start_window(self._ids[self._read_offset :])
        return delta

    def _start_window(self, emitted: list[int]) -> None:
        """Make the last few `emitted` ids the context of the next window."""
        start = max(0, len(emitted) - CONTEXT_TOKENS)
        while start < len(emitted) and (
            emitted[start] in self._byte_ids or emitted[start] in self._hidden
        ):
            start += 1  # never start inside a byte run: it decodes differently from the middle
        context = emitted[start:]
        prefix_text = self._decode(context)
        if not self._ends_cleanly(context, prefix_text):
            # It ends mid-character (a prompt cut there, or text forced out early): what comes
            # next would join that character; decode it on its own instead, as decode() would.
            context, prefix_text = [], ""
        self._ids, self._read_offset, self._prefix_text = context, len(context), prefix_text

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip) if ids else ""
