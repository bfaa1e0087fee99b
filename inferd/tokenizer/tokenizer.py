"""The engine's tokenizer: HF `tokenizers` underneath, loaded from a HF folder or a GGUF file.

Text in and out of the engine passes here: `encode` for prompts, `decode` (and the incremental
detokenizer built on it) for outputs, `apply_chat_template` for chat requests, and the ids that
end generation (`eos_token_ids`). The special-token policy (BOS added or not, which ids stop)
comes from the checkpoint, following what HF transformers does with the same files.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokenizers import AddedToken, processors
from tokenizers import Tokenizer as Backend

from inferd.errors import ModelLoadError
from inferd.loader.gguf_file import GGUFFile

if TYPE_CHECKING:
    from inferd.loader.checkpoint import Checkpoint
from inferd.tokenizer.chat_template import ChatTemplate, default_chat_template
from inferd.tokenizer.gguf_vocab import GEMMA_ARCHITECTURES, GGUFVocab, load_gguf_backend

_NAMED_SPECIALS = ("bos_token", "eos_token", "unk_token", "pad_token")


class Tokenizer:
    """A `tokenizers.Tokenizer` plus the checkpoint's special-token policy and chat template."""

    def __init__(
        self,
        backend: Backend,
        *,
        special_tokens: dict[str, str | None] | None = None,
        extra_eos_token_ids: Iterable[int] = (),
        add_bos_token: bool | None = None,
        add_eos_token: bool | None = None,
        chat_template: str | None = None,
    ):
        """`add_bos_token`/`add_eos_token`: None keeps the backend's post-processor; a bool
        replaces it (as HF does when the checkpoint states either flag)."""
        self._backend = backend
        self.special_tokens = {k: v for k, v in (special_tokens or {}).items() if v is not None}
        if add_bos_token is not None or add_eos_token is not None:
            self._set_post_processor(bool(add_bos_token), bool(add_eos_token))
        eos = [self.eos_token_id, *extra_eos_token_ids]
        self._eos_token_ids = tuple(dict.fromkeys(int(i) for i in eos if i is not None))
        self._chat_template: ChatTemplate | None = None
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
        vocab = GGUFVocab.from_metadata(md, arch)
        backend = load_gguf_backend(vocab, cache_dir() / "tokenizers" if cache else None)

        def token_of(key: str) -> str | None:
            token_id = md.get(f"tokenizer.ggml.{key}")
            if token_id is None or not 0 <= int(token_id) < backend.get_vocab_size():
                return None
            return backend.id_to_token(int(token_id))

        special = {
            name: token_of(key) for name, key in zip(_NAMED_SPECIALS, _GGUF_ID_KEYS, strict=True)
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
            raise ModelLoadError(f"{tokenizer_json}: cannot be read by `tokenizers`: {e}") from e
        config = _read_json(folder / "tokenizer_config.json")
        _add_config_tokens(backend, config)
        special = {name: _token_content(config.get(name)) for name in _NAMED_SPECIALS}
        generation = _read_json(folder / "generation_config.json")
        extra_eos = generation.get("eos_token_id")
        extra_eos = [extra_eos] if isinstance(extra_eos, int) else list(extra_eos or [])
        # NOTE: as in HF transformers 5, tokenizer.json's post-processor decides BOS/EOS and
        # the config's add_bos_token/add_eos_token only apply when the file has none.
        use_flags = backend.post_processor is None
        return cls(
            backend,
            special_tokens=special,
            extra_eos_token_ids=extra_eos,
            add_bos_token=config.get("add_bos_token") if use_flags else None,
            add_eos_token=config.get("add_eos_token") if use_flags else None,
            chat_template=chat_template or _hf_chat_template(folder, config),
        )

    # --- encoding and decoding -------------------------------------------------------------------

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        if not isinstance(ids, list):
            ids = [int(i) for i in ids]  # numpy / torch integers
        return self._backend.decode(ids, skip_special_tokens=skip_special_tokens)

    def convert_ids_to_tokens(self, ids: Iterable[int]) -> list[str]:
        return [self._backend.id_to_token(int(i)) for i in ids]

    def token_to_id(self, token: str) -> int | None:
        return self._backend.token_to_id(token)

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **kwargs: Any
    ) -> str:
        """The prompt text for `messages`. NOTE: templates usually write the BOS token
        themselves, so encode the result with `add_special_tokens=False` (or use
        `encode_chat`), or the prompt starts with two BOS tokens."""
        if self._chat_template is None:
            raise ValueError(
                "this model has no chat template; pass one with --chat-template "
                "(or the chat_template argument), or send a plain completion prompt"
            )
        variables = {**self.special_tokens, **kwargs}
        return self._chat_template.render(messages, add_generation_prompt, **variables)

    def encode_chat(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **kwargs: Any
    ) -> list[int]:
        """Token ids of the chat prompt (special tokens as the template writes them)."""
        text = self.apply_chat_template(messages, add_generation_prompt, **kwargs)
        return self.encode(text, add_special_tokens=False)

    # --- properties ------------------------------------------------------------------------------

    @property
    def backend(self) -> Backend:
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
        added = self._backend.get_added_tokens_decoder()
        return tuple(sorted(i for i, token in added.items() if token.special))

    @cached_property
    def byte_fallback_ids(self) -> frozenset[int]:
        """Ids of `<0xNN>` tokens when the decoder joins them into UTF-8 (SentencePiece byte
        fallback): a run of them is one unit of text for the detokenizer."""
        decoder = self._backend.decoder
        if decoder is None or '"ByteFallback"' not in decoder.__getstate__().decode():
            return frozenset()
        ids = (self._backend.token_to_id(f"<0x{b:02X}>") for b in range(256))
        return frozenset(i for i in ids if i is not None)

    @property
    def chat_template(self) -> str | None:
        return None if self._chat_template is None else self._chat_template.source

    @chat_template.setter
    def chat_template(self, source: str | None) -> None:
        self._chat_template = ChatTemplate(source) if source else None

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
        self._backend.post_processor = processors.TemplateProcessing(
            single=single, pair=pair, special_tokens=specials
        )


_GGUF_ID_KEYS = ("bos_token_id", "eos_token_id", "unknown_token_id", "padding_token_id")
# llama.cpp's own names for tokens that end a turn; files state them when the model has them.
_GGUF_TURN_END_KEYS = ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")


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


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise ModelLoadError(f"{path}: invalid JSON ({e})") from e
    return value if isinstance(value, dict) else {}


def _token_content(value: Any) -> str | None:
    """A special token in tokenizer_config.json: a string or an AddedToken-like dict."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _add_config_tokens(backend: Backend, config: dict[str, Any]) -> None:
    """Tokens tokenizer_config.json declares that tokenizer.json lacks (HF adds them too)."""
    declared = config.get("added_tokens_decoder") or {}
    entries = sorted(declared.items(), key=lambda item: int(item[0]))
    for _, entry in entries:
        if isinstance(entry, dict) and backend.token_to_id(entry.get("content", "")) is None:
            fields = ("single_word", "lstrip", "rstrip", "normalized", "special")
            options = {k: bool(entry[k]) for k in fields if k in entry}
            backend.add_tokens([AddedToken(entry["content"], **options)])
    for name in _NAMED_SPECIALS:
        token = _token_content(config.get(name))
        if token and backend.token_to_id(token) is None:
            backend.add_special_tokens([AddedToken(token, special=True, normalized=False)])


def _hf_chat_template(folder: Path, config: dict[str, Any]) -> str | None:
    """HF's precedence: chat_template.jinja, then chat_template.json, then the config's key."""
    jinja_file = folder / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    template = _read_json(folder / "chat_template.json").get("chat_template")
    if template is None:
        template = config.get("chat_template")
    if isinstance(template, list):  # named templates: the "default" one serves plain chat
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    return template if isinstance(template, str) and template else None
