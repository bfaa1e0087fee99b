"""One entry point for every model source: `open_checkpoint(path)` → a `Checkpoint` that knows
its config and its tensors, whatever the format on disk (its tokenizer:
`inferd.tokenizer.checkpoint_tokenizer`)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from inferd.config import ModelConfig
from inferd.errors import ModelLoadError
from inferd.loader import hf_dir
from inferd.loader.checkpoint_checks import check_config_matches_tensors
from inferd.loader.gguf_file import GGUFFile
from inferd.loader.gguf_model import gguf_weights, model_config_from_gguf
from inferd.loader.hf_config import model_config_from_hf
from inferd.loader.hf_quant_config import QuantFormat, read_quant_format
from inferd.loader.hf_quantized import grouped, logical_shapes
from inferd.loader.tensor_layout import normalized, normalized_shapes
from inferd.models.architecture import Architecture
from inferd.models.registry import architecture


@dataclass
class Checkpoint:
    path: Path
    format: str  # "gguf" or "hf"
    config: ModelConfig
    gguf: GGUFFile | None = None
    quant: QuantFormat | None = None  # an HF folder's pre-quantised weights (hf_quant_config.py)

    @property
    def architecture(self) -> Architecture:
        """The family's record (inferd/models/): names, shapes, chat and tool defaults."""
        return architecture(self.config.architecture)

    def release_file_pages(self) -> None:
        """After loading: a GGUF file's mapped pages leave this process's RSS (GGUFFile
        `release_pages`). An HF folder's files are not kept mapped by the checkpoint."""
        if self.gguf is not None:
            self.gguf.release_pages()

    def weights(self) -> Iterator[tuple[str, object]]:
        """(HF name, lazy weight) pairs, one 2-D matrix per projection and per expert
        (tensor_layout.py); `weight.load(dtype, rows=, cols=)` reads a tensor or just the slice
        a tensor-parallel rank keeps."""
        if self.gguf is not None:
            raw = gguf_weights(self.gguf, self.config)
        else:
            raw = hf_dir.hf_weights(self.path)
            raw = raw if self.quant is None else grouped(raw, self.quant)
        return normalized(raw, self.architecture, self.config)

    @property
    def display_name(self) -> str:
        return self.config.name or self.path.name


def _open_gguf(path: Path) -> Checkpoint:
    gguf = GGUFFile(path)
    try:
        config = model_config_from_gguf(gguf)
    except ModelLoadError:
        raise
    except ValueError as e:  # ModelConfig's own consistency checks
        raise ModelLoadError(f"{path}: {e}") from e
    record = architecture(config.architecture)
    shapes = {name: w.shape for name, w in normalized(gguf_weights(gguf, config), record, config)}
    check_config_matches_tensors(config, shapes, path)
    return Checkpoint(path, "gguf", config, gguf)


def gguf_file_of(model: str | Path | None) -> Path | None:
    """The GGUF file `open_checkpoint(model)` will read, where that is plain without reading
    anything: the embedded default model, or a path to a .gguf file; else None."""
    if model is None:
        from inferd.loader.default_model import default_model_path

        return default_model_path()
    path = Path(model).expanduser()
    return path if path.suffix == ".gguf" and path.is_file() else None


def open_checkpoint(model: str | Path | None) -> Checkpoint:
    """`None` → the embedded default model; a short name of loader/catalog.py (a path of that
    name wins); a .gguf file; an HF folder; a folder with one .gguf."""
    if model is None:
        from inferd.loader.default_model import default_model_path

        return _open_gguf(default_model_path())
    path = Path(model).expanduser()
    if not path.exists():
        from inferd.loader.catalog import known_names
        from inferd.loader.short_name import resolve

        if (named := resolve(str(model))) is not None:
            return _open_gguf(named)
        raise ModelLoadError(
            f"model path does not exist: {path} (short names: {', '.join(known_names())})"
        )
    if path.is_file():
        if path.suffix in hf_dir.PICKLE_SUFFIXES:
            raise ModelLoadError(hf_dir.pickle_refusal(path))
        if path.suffix == ".safetensors":
            path = path.parent
        else:
            return _open_gguf(path)
    config_file = path / "config.json"
    if config_file.exists():
        cfg = hf_dir.read_json(config_file)
        config = model_config_from_hf(cfg, name=path.name, source=config_file)
        quant = read_quant_format(cfg, path)
        stored = {name: shape for name, (shape, _) in hf_dir.hf_tensor_shapes(path).items()}
        if quant is not None:
            stored = logical_shapes(stored, quant)
        shapes = normalized_shapes(stored, architecture(config.architecture), config)
        check_config_matches_tensors(config, shapes, path)
        return Checkpoint(path, "hf", config, quant=quant)
    ggufs = sorted(path.glob("*.gguf"))
    if len(ggufs) == 1:
        return _open_gguf(ggufs[0])
    if len(ggufs) > 1:
        raise ModelLoadError(
            f"{path} holds several GGUF files ({', '.join(g.name for g in ggufs)}); pass one file"
        )
    pickles = [p for p in path.iterdir() if p.suffix in hf_dir.PICKLE_SUFFIXES]
    if pickles:
        raise ModelLoadError(hf_dir.pickle_refusal(pickles[0]))
    raise ModelLoadError(f"{path}: not a model (no config.json and no .gguf file)")
