"""How far the embedded model's embeddings are from HF transformers' final hidden states (same
GGUF, dequantised to float32), per pooling type and prompt length: the parity mode (float32
weights, PyTorch attention) as the largest absolute difference, the default mode (GGUF blocks,
the C decoder layer) as the relative L2 error. Loading HF takes ~45 s.

    python scripts/embedding_accuracy.py
"""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM

from inferd import LLM, PoolingParams
from inferd.loader.default_model import default_model_path

TEXTS = ["What is CUDA?", "The capital of France is Paris, a city on the Seine.",
         "def f(x):\n    return x * 2\n" * 10]  # fmt: skip


def main() -> None:
    path = default_model_path()
    hf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                              dtype=torch.float32).eval()  # fmt: skip
    exact = LLM(dtype="float32", attention_backend="torch", kv_cache_memory=512 << 20)
    default = LLM(kv_cache_memory=256 << 20)
    tok = exact.get_tokenizer()
    print("pooling  tokens  parity mode max |diff|  default mode relative error")
    for kind in ("last", "mean", "cls"):
        params = PoolingParams(pooling_type=kind, normalize=False)
        for text in TEXTS:
            ids = tok.encode(text)
            with torch.no_grad():
                hidden = hf(torch.tensor([ids]), output_hidden_states=True).hidden_states[-1][0]
            ref = {"last": hidden[-1], "mean": hidden.mean(0), "cls": hidden[0]}[kind].float()
            prompt = [{"prompt_token_ids": ids}]
            a = torch.tensor(exact.embed(prompt, params, use_tqdm=False)[0].outputs.embedding)
            b = torch.tensor(default.embed(prompt, params, use_tqdm=False)[0].outputs.embedding)
            print(f"{kind:7}  {len(ids):6}  {(a - ref).abs().max():22.2e}  "
                  f"{(b - ref).norm() / ref.norm():27.2e}")  # fmt: skip


if __name__ == "__main__":
    main()
