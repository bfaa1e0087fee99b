"""Regenerates HF transformers' reference outputs on the embedded Gemma 3 270M that the parity
tests compare against (tests/parity/gemma_reference.py says which, and why they are stored):
HF's tokenizer converted from the GGUF file, and the model dequantised from it to float32, exactly
as the tests loaded them live before (~45-60 s here, once).

    python scripts/gemma_hf_reference.py

Writes tests/parity/gemma_hf_reference.json (token ids, texts, the tokenizer's facts) and
tests/parity/gemma_hf_reference.safetensors (float32 logits and hidden states). Run it again when
the embedded model's file, transformers or the inputs in gemma_reference.py change; the tests
refuse a reference made from another GGUF file.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

TESTS = Path(__file__).resolve().parents[1] / "tests"
sys.path[:0] = [str(TESTS), str(TESTS / "parity")]

import gemma_reference as ref  # noqa: E402
from tiny_models import hf_greedy  # noqa: E402


def tokenizer_reference(hf_tok) -> dict:
    """What test_tokenizer_parity.py compares inferd's tokenizer with."""
    texts = []
    for text in ref.TOKENIZER_TEXTS:
        ids = hf_tok(text)["input_ids"]
        texts.append({
            "ids": ids,
            "plain_ids": hf_tok(text, add_special_tokens=False)["input_ids"],
            "decoded": hf_tok.decode(ids, skip_special_tokens=False),
            "decoded_skip_special": hf_tok.decode(ids, skip_special_tokens=True),
            "tokens": hf_tok.convert_ids_to_tokens(ids),
        })  # fmt: skip
    backend = hf_tok.backend_tokenizer
    vocab = backend.get_vocab()
    # Every entry's own text, encoded: almost all give their own id alone; the rest are stored.
    entries = sorted(vocab.items(), key=lambda item: item[1])
    encoded = backend.encode_batch([t.replace("\u2581", " ") for t, _ in entries],
                                   add_special_tokens=False)  # fmt: skip
    other = {str(i): e.ids for (_, i), e in zip(entries, encoded, strict=True) if e.ids != [i]}
    special = sorted(i for i, t in hf_tok.added_tokens_decoder.items() if t.special)
    return {
        "texts": texts,
        "long_document_ids": hf_tok(ref.long_document())["input_ids"],
        "vocab_sha256": ref.vocabulary_digest(vocab),
        "vocab_entries_not_their_own_id": other,
        "len": len(hf_tok),
        "bos_token_id": hf_tok.bos_token_id,
        "eos_token_id": hf_tok.eos_token_id,
        "pad_token_id": hf_tok.pad_token_id,
        "special_ids": special,
    }


def main() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from inferd.loader.default_model import default_model_path

    gguf = default_model_path()
    folder, name = str(gguf.parent), gguf.name
    hf_tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    model = model.eval()
    sha = ref.file_sha256(gguf)
    greedy = []
    tensors = {}
    for prompt in ref.GREEDY_PROMPTS:
        ids = hf_tok(prompt)["input_ids"]
        greedy.append({"prompt_ids": ids, "tokens": hf_greedy(model, ids, ref.GREEDY_TOKENS)[1]})
    long_ids = hf_tok(ref.LONG)["input_ids"]
    with torch.no_grad():
        tensors["long_last_logits"] = model(torch.tensor([long_ids])).logits[0, -1].float()
    embeddings = []
    for i, text in enumerate(ref.EMBEDDING_TEXTS):
        ids = hf_tok(text)["input_ids"]
        with torch.no_grad():
            out = model(torch.tensor([ids]), output_hidden_states=True)
        tensors[f"hidden_{i}"] = out.hidden_states[-1][0].float().contiguous()
        embeddings.append({"prompt_ids": ids})
    reference = {
        "gguf": name,
        "gguf_sha256": sha,
        "made_with": {"transformers": transformers.__version__, "torch": torch.__version__},
        "tokenizer": tokenizer_reference(hf_tok),
        "greedy": greedy,
        "long_prompt_ids": long_ids,
        "embeddings": embeddings,
    }
    ref.JSON_PATH.write_text(json.dumps(reference, ensure_ascii=False, indent=None) + "\n")
    save_file(tensors, ref.TENSORS_PATH, metadata={"gguf_sha256": sha})
    print(f"wrote {ref.JSON_PATH} and {ref.TENSORS_PATH}")


if __name__ == "__main__":
    main()
