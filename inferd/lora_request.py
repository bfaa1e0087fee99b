"""Which LoRA adapter a request runs under, with vLLM's names:

    LoRARequest(lora_name, lora_int_id, lora_path)

`lora_name` is what clients call it (the `model` of an API request), `lora_int_id` a positive
integer unique among the adapters an engine serves (its caches key on it), `lora_path` the PEFT
folder (`adapter_config.json` + `adapter_model.safetensors`). Plain data: it crosses the process
boundary to the engine core inside a `CoreRequest`, and is part of a request's prefix-cache hashes
(`identity`), so blocks computed under one adapter are never reused under another.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from inferd.errors import InvalidRequest


@dataclass(frozen=True)
class LoRARequest:
    lora_name: str
    lora_int_id: int
    lora_path: str

    def __post_init__(self) -> None:
        if not isinstance(self.lora_name, str) or not self.lora_name:
            raise InvalidRequest("lora_request", "lora_name must be a non-empty string, got "
                                 f"{self.lora_name!r}")  # fmt: skip
        if not isinstance(self.lora_int_id, int) or isinstance(self.lora_int_id, bool) \
                or not 1 <= self.lora_int_id < 2**63:  # fmt: skip
            raise InvalidRequest("lora_request", "lora_int_id must be a positive integer, got "
                                 f"{self.lora_int_id!r}")  # fmt: skip
        if not isinstance(self.lora_path, str) or not self.lora_path:
            raise InvalidRequest("lora_request", "lora_path must be a non-empty string (a PEFT "
                                 f"adapter folder), got {self.lora_path!r}")  # fmt: skip

    @property
    def identity(self) -> str:
        """What names the adapter's weights for the prefix cache: id, name and folder."""
        return f"{self.lora_int_id}\0{self.lora_name}\0{self.lora_path}"

    @classmethod
    def of(cls, value: Any) -> LoRARequest:
        """A LoRARequest, or a dict with its three fields (what an RPC boundary may deliver)."""
        if isinstance(value, cls):
            return value
        if isinstance(value, dict) and set(value) == {"lora_name", "lora_int_id", "lora_path"}:
            return cls(**value)
        raise InvalidRequest("lora_request", "lora_request must be a LoRARequest(lora_name, "
                             f"lora_int_id, lora_path), got {type(value).__name__}")  # fmt: skip
