"""What `inferd serve` and its Ray replicas (serve_ray_factories.py) do alike once a model is
loaded: describe the served model to the front end, set its chat template, show the start-up
log lines."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("inferd.serve")


@dataclass
class ServedModel:
    """What the front end knows of the served model, wherever the engine core runs."""

    tokenizer: Any
    model_config: Any
    checkpoint: Any
    max_model_len: int
    max_num_seqs: int

    @classmethod
    def of_engine(cls, engine) -> ServedModel:
        """The model an in-process `LLMEngine` serves."""
        return cls(engine.tokenizer, engine.model_config, engine.setup.checkpoint,
                   engine.max_model_len, engine.setup.max_num_seqs)  # fmt: skip


def show_startup_logs() -> None:
    # The CLI's default level is WARNING; a server's startup lines (model, template, address)
    # are what its operator reads, so they show unless the user asked for less.
    if logging.getLogger().getEffectiveLevel() == logging.WARNING:
        for name in ("inferd.serve", "inferd.server.app", "inferd.access"):
            logging.getLogger(name).setLevel(logging.INFO)


def set_chat_template(engine: ServedModel, template: str | None) -> None:
    from inferd.tokenizer.template_files import default_chat_template

    tok = engine.tokenizer
    if template:
        tok.chat_template = template
        log.info("chat template: from --chat-template")
        return
    tok.compiled_chat_template()  # the model's own: a broken one stops the start, not a request
    default = default_chat_template(engine.model_config.architecture)
    gguf = engine.checkpoint.gguf
    shipped = gguf is not None and gguf.metadata.get("tokenizer.chat_template")
    if tok.chat_template is None:
        log.warning(
            "this model has no chat template: /v1/chat/completions answers 400 until "
            "one is given with --chat-template"
        )
    elif default is not None and not shipped and tok.chat_template == default:
        log.info(
            "chat template: the model file has none; using inferd's bundled %s template "
            "(override with --chat-template)",
            engine.model_config.architecture,
        )
    else:
        log.info("chat template: the model's own (override with --chat-template)")
