"""`POST /v1/load_lora_adapter` and `POST /v1/unload_lora_adapter`, vLLM's routes: adapters
added to or taken from the names a request's `model` may use, while the server runs. They exist
only on a server started with `--allow-runtime-lora-updating` (vLLM:
VLLM_ALLOW_RUNTIME_LORA_UPDATING=true): whoever can call them chooses files the server reads.

A loaded adapter gets a fresh `lora_int_id`, so a name loaded again from another folder never
shares prefix-cache blocks with its earlier weights. Its config is checked by the engine when a
request first names it (a 400 for that request, as with any adapter); here only that the folder
holds a PEFT adapter's two files. Unloading takes the name away; requests already running keep
their adapter until they finish, and its slot is then reused as any other.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from inferd.lora_request import LoRARequest
from inferd.server.http.errors import APIError
from inferd.server.state import get_state

router = APIRouter()
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


class LoadLoRARequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lora_name: str = Field(min_length=1)
    lora_path: str = Field(min_length=1)


class UnloadLoRARequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lora_name: str = Field(min_length=1)
    lora_int_id: int | None = None


@router.post("/v1/load_lora_adapter")
async def load_lora_adapter(body: LoadLoRARequest, request: Request) -> Response:
    state = get_state(request)
    if body.lora_name in state.adapters or body.lora_name in state.model_names:
        raise APIError(400, f"the name {body.lora_name!r} is already served", param="lora_name")
    folder = Path(body.lora_path)
    missing = [f for f in ADAPTER_FILES if not (folder / f).is_file()]
    if missing:
        raise APIError(400, f"lora_path {body.lora_path!r} lacks {', '.join(missing)}",
                       param="lora_path")  # fmt: skip
    state.next_lora_id = max([state.next_lora_id, *(a.lora_int_id + 1
                                                    for a in state.adapters.values())])  # fmt: skip
    state.adapters[body.lora_name] = LoRARequest(body.lora_name, state.next_lora_id, str(folder))
    state.next_lora_id += 1
    return Response(f"Success: LoRA adapter '{body.lora_name}' added successfully.",
                    media_type="text/plain")  # fmt: skip


@router.post("/v1/unload_lora_adapter")
async def unload_lora_adapter(body: UnloadLoRARequest, request: Request) -> Response:
    state = get_state(request)
    lora = state.adapters.get(body.lora_name)
    if lora is None or (body.lora_int_id is not None and body.lora_int_id != lora.lora_int_id):
        raise APIError(404, f"no LoRA adapter {body.lora_name!r} is loaded", param="lora_name")
    del state.adapters[body.lora_name]
    return Response(f"Success: LoRA adapter '{body.lora_name}' removed successfully.",
                    media_type="text/plain")  # fmt: skip
