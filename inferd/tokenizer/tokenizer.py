"""The engine's tokenizer, loaded from a HF folder or a GGUF file: HF `tokenizers` underneath,
or for Gemma's GGUF vocabularies the compact tokenizer that computes the same (compact_bpe.py).

Text in and out of the engine passes here: `encode` for prompts, `decode` (and the incremental
detokenizer built on it) for outputs, `apply_chat_template` / `encode_chat` for chat requests,
and the ids that end generation (`eos_token_ids`). The special-token policy (BOS added or not,
which ids stop) comes from the checkpoint, following what HF transformers does with the same
files. Text from users is checked to be valid Unicode, and chat messages cannot smuggle in
special tokens unless asked to (`split_special_tokens=False`; see text_guard.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokenizers import Tokenizer as Backend
from tokenizers import processors

from inferd.errors import ModelLoadError
from inferd.loader.gguf_file import GGUFFile
from inferd.tokenizer.chat_prompt import build_chat_prompt
from inferd.tokenizer.compact_bpe import CompactBPE
from inferd.tokenizer.fim import FIMTokens, fim_tokens, gguf_fim_ids
from inferd.tokenizer.gguf_backend import load_gguf_backend
from inferd.tokenizer.gguf_vocab import GEMMA_ARCHITECTURES, GGUFVocab
from inferd.tokenizer.hf_export import tokenizer_config
from inferd.tokenizer.hf_tokenizer_files import (
    NAMED_SPECIALS,
    add_config_tokens,
    hf_chat_template,
    read_json,
    token_content,
    token_ids,
)
from inferd.tokenizer.template_files import default_chat_template
from inferd.tokenizer.text_guard import SpecialTokenGuard, check_unicode, encode_unlocked

if TYPE_CHECKING:
    from inferd.loader.checkpoint import Checkpoint
    from inferd.tokenizer.chat_template import ChatTemplate


class Tokenizer:
    """A `tokenizers.Tokenizer` (or CompactBPE) plus the checkpoint's special-token policy and
    chat template."""

    def __init__(
        self,
        backend: Backend,
        *,
        special_tokens: dict[str, str | None] | None = None,
        extra_eos_token_ids: Iterable[int] = (),
        add_bos_token: bool | None = None,
        add_eos_token: bool | None = None,
        chat_template: str | None = None,
        fim_token_ids: dict[str, int] | None = None,
    ):
        """`add_bos_token`/`add_eos_token`: None keeps the backend's post-processor; a bool
        replaces it (as HF does when the checkpoint states either flag). `fim_token_ids`: the
        fill-in-the-middle ids a GGUF file names (fim.py; else found by token name)."""
        self._backend = backend
        self.fim_token_ids = dict(fim_token_ids or {})
        self.special_tokens = {k: v for k, v in (special_tokens or {}).items() if v is not None}
        if add_bos_token is not None or add_eos_token is not None:
            self._set_post_processor(bool(add_bos_token), bool(add_eos_token))
        eos = [self.eos_token_id, *extra_eos_token_ids, *_harmony_ends(backend)]
        self._eos_token_ids = tuple(dict.fromkeys(int(i) for i in eos if i is not None))
        # NOTE: the source, compiled on first use (`compiled_chat_template`): compiling needs
        # Jinja, whose import would otherwise cost every start, chat or not.
        self._chat_source: str | None = None
        self._compiled: ChatTemplate | None = None
        self.chat_template = chat_template

    # --- loaders -----------------------------------------------------------------------------

    @classmethod
    def from_gguf(
        cls, gguf_file: GGUFFile, *, chat_template: str | None = None, cache: bool = True
    ) -> Tokenizer:
        """The tokenizer HF transformers builds from this GGUF file (cached after the first
        build under `cache_dir()/tokenizers/`). Without a template in the file or the
        `chat_template` argument, the architecture's bundled default is used (Gemma)."""
        from inferd.cache import cache_dir  # local: keeps imports light

        md, arch = gguf_file.metadata, gguf_file.architecture
        try:
            vocab = GGUFVocab.from_metadata(md, arch)
            backend = load_gguf_backend(vocab, cache_dir() / "tokenizers" if cache else None)
        except ModelLoadError as e:
            raise ModelLoadError(f"{gguf_file.path}: {e}") from e
        except Exception as e:  # noqa: BLE001 - `tokenizers` rejects a crafted vocabulary its own way
            raise ModelLoadError(
                f"{gguf_file.path}: cannot build a tokenizer from its vocabulary "
                f"({type(e).__name__}: {' '.join(str(e).split())})"
            ) from e

        def token_of(key: str) -> str | None:
            token_id = md.get(f"tokenizer.ggml.{key}")
            if token_id is None or not 0 <= int(token_id) < backend.get_vocab_size():
                return None
            return backend.id_to_token(int(token_id))

        special = {
            name: token_of(key) for name, key in zip(NAMED_SPECIALS, _GGUF_ID_KEYS, strict=True)
        }
        add_bos = md.get("tokenizer.ggml.add_bos_token")
        if add_bos is None and vocab.model == "llama":
            add_bos = True  # llama.cpp (and HF) add BOS to SentencePiece vocabs by default
        if vocab.model == "gemma4":
            add_bos = False  # its chat template writes <bos> itself (HF follows the reference)
        extra_eos = [md[k] for k in _GGUF_TURN_END_KEYS if md.get(k) is not None]
        if arch in GEMMA_ARCHITECTURES and backend.token_to_id("<end_of_turn>") is not None:
            # NOTE: Gemma's chat models close every turn with <end_of_turn> (id 106) and only
            # rarely emit <eos>; HF's generation_config lists both, but a GGUF carries just
            # <eos>. Without this, a chat reply would run on into an invented next turn.
            extra_eos.append(backend.token_to_id("<end_of_turn>"))
        template = chat_template or md.get("tokenizer.chat_template") or default_chat_template(arch)
        return cls(
            backend,
            special_tokens=special,
            extra_eos_token_ids=extra_eos,
            add_bos_token=bool(add_bos),
            add_eos_token=bool(md.get("tokenizer.ggml.add_eos_token", False)),
            chat_template=template,
            fim_token_ids=gguf_fim_ids(md, backend.get_vocab_size()),
        )

    @classmethod
    def from_hf_dir(cls, path: str | Path, *, chat_template: str | None = None) -> Tokenizer:
        """A HF model folder: tokenizer.json, tokenizer_config.json, generation_config.json and
        chat_template.jinja / chat_template.json when present."""
        folder = Path(path)
        tokenizer_json = folder / "tokenizer.json"
        if not tokenizer_json.is_file():
            raise ModelLoadError(
                f"{folder}: no tokenizer.json (only the fast-tokenizer format is supported)"
            )
        try:
            backend = Backend.from_file(str(tokenizer_json))
        except Exception as e:
            reason = " ".join(str(e).split())  # one line, whatever the library wrote
            raise ModelLoadError(
                f"{tokenizer_json}: cannot be read by `tokenizers`: {reason}"
            ) from e
        config_file = folder / "tokenizer_config.json"
        config = read_json(config_file)
        add_config_tokens(backend, config, config_file)
        special = {name: token_content(config.get(name)) for name in NAMED_SPECIALS}
        generation_file = folder / "generation_config.json"
        extra_eos = token_ids(read_json(generation_file).get("eos_token_id"), generation_file)
        # NOTE: as in HF transformers 5, tokenizer.json's post-processor decides BOS/EOS and
        # the config's add_bos_token/add_eos_token only apply when the file has none.
        use_flags = backend.post_processor is None
        return cls(
            backend,
            special_tokens=special,
            extra_eos_token_ids=extra_eos,
            add_bos_token=config.get("add_bos_token") if use_flags else None,
            add_eos_token=config.get("add_eos_token") if use_flags else None,
            chat_template=chat_template or hf_chat_template(folder, config),
        )

    # --- encoding and decoding -------------------------------------------------------------------

    def encode(
        self, text: str, add_special_tokens: bool = True, split_special_tokens: bool = False
    ) -> list[int]:
        """Token ids of `text`. `split_special_tokens=True` (HF's name) encodes special-token
        strings in it as plain text; by default they become their ids, as in HF and vLLM.
        Invalid Unicode (a lone surrogate) is a ValueError. A long text does not hold Python's
        lock while it is encoded (text_guard.py `encode_unlocked`)."""
        if not isinstance(text, str):
            raise ValueError(f"text to tokenize must be a string, got {type(text).__name__}")
        check_unicode(text, "text to tokenize")
        if split_special_tokens:
            return self.special_token_guard.encode_plain(text, add_special_tokens)
        return encode_unlocked(self._backend, text, add_special_tokens).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        if not isinstance(ids, list):
            ids = [int(i) for i in ids]  # numpy / torch integers
        return self._backend.decode(ids, skip_special_tokens=skip_special_tokens)

    def convert_ids_to_tokens(self, ids: Iterable[int]) -> list[str]:
        return [self._backend.id_to_token(int(i)) for i in ids]

    def token_to_id(self, token: str) -> int | None:
        return self._backend.token_to_id(token)

    def apply_chat_template(
        self, messages: list[dict[str, Any]], /, add_generation_prompt: bool = True,
        *, chat_template_kwargs: dict[str, Any] | None = None, **kwargs: Any,
    ) -> str:  # fmt: skip
        """The prompt text (see `chat_prompt`). NOTE: encoding it yourself loses the guard
        against special tokens typed into messages; use `encode_chat` / `chat_prompt`."""
        return self.chat_prompt(messages, add_generation_prompt, split_special_tokens=False,
                                chat_template_kwargs=chat_template_kwargs, tokenize=False,
                                **kwargs)[0]  # fmt: skip

    def encode_chat(
        self, messages: list[dict[str, Any]], /, add_generation_prompt: bool = True,
        *, split_special_tokens: bool = True,
        chat_template_kwargs: dict[str, Any] | None = None, **kwargs: Any,
    ) -> list[int]:  # fmt: skip
        """The prompt's token ids (see `chat_prompt`)."""
        return self.chat_prompt(messages, add_generation_prompt,
                                split_special_tokens=split_special_tokens,
                                chat_template_kwargs=chat_template_kwargs, **kwargs)[1]  # fmt: skip

    def chat_prompt(
        self, messages: list[dict[str, Any]], /, add_generation_prompt: bool = True,
        *, split_special_tokens: bool = True, chat_template_kwargs: dict[str, Any] | None = None,
        tokenize: bool = True, continue_final_message: bool = False,
        chat_template: ChatTemplate | None = None, **kwargs: Any,
    ) -> tuple[str, list[int]]:  # fmt: skip
        """(prompt text, token ids) for `messages`. The template's own special tokens become
        their ids; with `split_special_tokens` (the default) special-token strings inside the
        messages and template variables stay plain text, so a user cannot forge a turn; False
        lets them through as special tokens (trusted callers only). Variables come from the
        tokenizer (bos_token, ...), then `chat_template_kwargs`, then `kwargs`. Invalid
        Unicode anywhere in the input is a ValueError naming where. `continue_final_message`
        ends the prompt inside the final message (the model continues it); `chat_template`
        renders with that template instead of the tokenizer's (e.g. a tool-aware one)."""
        template = chat_template if chat_template is not None else self.compiled_chat_template()
        return build_chat_prompt(self, template, messages, add_generation_prompt,
                                 chat_template_kwargs, kwargs, split_special_tokens,
                                 tokenize, continue_final_message)  # fmt: skip

    def hf_tokenizer_config(self, model_max_length: int | None = None) -> dict[str, Any]:
        """tokenizer_config.json's contents for this tokenizer (hf_export.py), as
        `inferd export-tokenizer` writes it and `/tokenizer_info` returns it."""
        return tokenizer_config(self, model_max_length)

    # --- properties ------------------------------------------------------------------------------

    @property
    def backend(self) -> Backend | CompactBPE:
        return self._backend

    @cached_property
    def vocab_size(self) -> int:
        """Ids in use, added tokens included (`tokenizers` recounts on every call: ~0.2 ms)."""
        return self._backend.get_vocab_size(with_added_tokens=True)

    def __len__(self) -> int:
        return self.vocab_size

    @property
    def bos_token_id(self) -> int | None:
        return self._id_of("bos_token")

    @property
    def eos_token_id(self) -> int | None:
        return self._id_of("eos_token")

    @property
    def pad_token_id(self) -> int | None:
        return self._id_of("pad_token")

    @property
    def unk_token_id(self) -> int | None:
        return self._id_of("unk_token")

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """Every id that ends generation: the tokenizer's EOS first, then the checkpoint's
        other stop ids (generation_config.json, end-of-turn tokens)."""
        return self._eos_token_ids

    @cached_property
    def all_special_ids(self) -> tuple[int, ...]:
        """Ids that `decode(..., skip_special_tokens=True)` drops: the special added tokens."""
        if isinstance(self._backend, CompactBPE):
            return self._backend.special_ids()
        added = self._backend.get_added_tokens_decoder()
        return tuple(sorted(i for i, token in added.items() if token.special))

    @cached_property
    def special_ids(self) -> frozenset[int]:
        """`all_special_ids` as one shared set (every detokenizer checks membership in it;
        Gemma has 6,249 special ids, ~0.5 MB as a set, so no per-sequence copies)."""
        return frozenset(self.all_special_ids)

    @cached_property
    def special_token_guard(self) -> SpecialTokenGuard:
        """Keeps special-token strings in user text plain (built on first use: ~50 ms)."""
        return SpecialTokenGuard(self._backend, self.special_ids)

    @cached_property
    def byte_fallback_ids(self) -> frozenset[int]:
        """Ids of `<0xNN>` tokens when the decoder joins them into UTF-8 (SentencePiece byte
        fallback): a run of them is one unit of text for the detokenizer."""
        decoder = self._backend.decoder
        if decoder is None or '"ByteFallback"' not in decoder.__getstate__().decode():
            return frozenset()
        ids = (self._backend.token_to_id(f"<0x{b:02X}>") for b in range(256))
        return frozenset(i for i in ids if i is not None)

    @cached_property
    def fim(self) -> FIMTokens | None:
        """The fill-in-the-middle tokens (fim.py); None when the model has none."""
        return fim_tokens(self)

    @property
    def chat_template(self) -> str | None:
        return self._chat_source

    @chat_template.setter
    def chat_template(self, source: str | None) -> None:
        self._chat_source, self._compiled = source or None, None

    def compiled_chat_template(self) -> ChatTemplate | None:
        """The chat template compiled (once; ValueError with the line of a syntax error)."""
        if self._compiled is None and self._chat_source is not None:
            from inferd.tokenizer.chat_template import ChatTemplate

            self._compiled = ChatTemplate(self._chat_source)
        return self._compiled

    # --- helpers ---------------------------------------------------------------------------------

    def _id_of(self, name: str) -> int | None:
        token = self.special_tokens.get(name)
        return None if token is None else self._backend.token_to_id(token)

    def _set_post_processor(self, add_bos: bool, add_eos: bool) -> None:
        # HF's rule: BOS and/or EOS around each sequence, dropped when the token is unknown.
        bos, eos = self.special_tokens.get("bos_token"), self.special_tokens.get("eos_token")
        bos_id = None if bos is None else self._backend.token_to_id(bos)
        eos_id = None if eos is None else self._backend.token_to_id(eos)
        add_bos, add_eos = add_bos and bos_id is not None, add_eos and eos_id is not None
        single = " ".join([f"{bos}:0"] * add_bos + ["$A:0"] + [f"{eos}:0"] * add_eos)
        pair = " ".join([single] + [f"{bos}:1"] * add_bos + ["$B:1"] + [f"{eos}:1"] * add_eos)
        specials = [(bos, bos_id)] * add_bos + [(eos, eos_id)] * add_eos
        processor = processors.TemplateProcessing(single=single, pair=pair, special_tokens=specials)
        if isinstance(self._backend, CompactBPE):
            self._backend.set_template([bos_id] * add_bos, [eos_id] * add_eos, processor)
        else:
            self._backend.post_processor = processor


_GGUF_ID_KEYS = ("bos_token_id", "eos_token_id", "unknown_token_id", "padding_token_id")
# llama.cpp's own names for tokens that end a turn; files state them when the model has them.
_GGUF_TURN_END_KEYS = ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")


def _harmony_ends(backend: Backend | CompactBPE) -> list[int | None]:
    """The ids that end a reply in a harmony vocabulary (gpt-oss): <|return|> after the answer,
    <|call|> after a tool call. HF's generation_config lists both, but a GGUF names one eos:
    without the other, a reply would run on past its call into an invented tool result."""
    if backend.token_to_id("<|channel|>") is None:
        return []
    return [backend.token_to_id("<|return|>"), backend.token_to_id("<|call|>")]


def checkpoint_tokenizer(checkpoint: Checkpoint) -> Tokenizer:
    """The tokenizer of an opened checkpoint (a GGUF file is not read a second time)."""
    if checkpoint.gguf is not None:
        return Tokenizer.from_gguf(checkpoint.gguf)
    return Tokenizer.from_hf_dir(checkpoint.path)


def load_tokenizer(path: str | Path, *, chat_template: str | None = None) -> Tokenizer:
    """The tokenizer of a model path: a .gguf file or a HF model folder."""
    path = Path(path)
    if path.is_dir():
        return Tokenizer.from_hf_dir(path, chat_template=chat_template)
    if path.is_file():
        return Tokenizer.from_gguf(GGUFFile(path), chat_template=chat_template)
    raise ModelLoadError(f"{path}: no such model file or folder")
