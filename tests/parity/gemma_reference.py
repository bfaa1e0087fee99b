"""HF transformers' outputs on the embedded Gemma 3 270M, stored in the repo: its tokenizer
converted from the GGUF file, and the model dequantised from it to float32. Loading them through
transformers takes ~45-60 s here (DESIGN.md: load it once, or keep its reference outputs in the
repo together with the script that regenerates them), so the tests on the embedded model compare
against these files; tests/parity/test_tiny_parity.py and test_family_parity.py compare against
live HF transformers on tiny random models, test_lora_chat_model.py on the chat model.

    python scripts/gemma_hf_reference.py      # regenerates gemma_hf_reference.{json,safetensors}

The inputs live here so that the script and the tests read the same ones. The files name the
GGUF file they were made from (its sha256): a reference of another file is refused, saying how
to make a new one."""

from __future__ import annotations

import hashlib
import json
from functools import cache
from pathlib import Path

import torch

JSON_PATH = Path(__file__).with_name("gemma_hf_reference.json")
TENSORS_PATH = Path(__file__).with_name("gemma_hf_reference.safetensors")
REGENERATE = "python scripts/gemma_hf_reference.py"

# test_tokenizer_parity.py: encoded and decoded by HF's tokenizer
TOKENIZER_TEXTS = [
    "",
    "Hello world",
    "The quick brown fox jumps over the lazy dog. It wasn't me, they'd said; O'Neil's car!",
    "Ça déborde: naïve façade, Zürich, São Paulo, Øresund, ĳ, ß, ﬁ ligature",
    "日本語のテキストと中文文本，还有한국어 문장。",
    "مرحبا بالعالم، هذا نص عربي.",
    "हिन्दी में एक वाक्य। नमस्ते दुनिया",
    "emoji 😀🎉 and ZWJ 👩‍👩‍👧‍👦 👨🏽‍💻 🏳️‍🌈 flags 🇫🇷🇯🇵 and 🫠",
    "rare letters 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ꙮ 𓀀 \u0000 \u200b\ufeff",
    "   leading spaces",
    "trailing spaces   ",
    "tabs\tand\t\ttabs\n\nnewlines\n\n\n\nmany\r\nwindows",
    "a  b   c    d     e" + " " * 40 + "f",
    "\n\n  \t \n",
    "def f(x):\n    if x > 0:\n        return [i ** 2 for i in range(x)]\n    return None\n",
    "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n",
    "<bos>text with <eos> inside and <pad> <unk> <mask> [multimodal] <unused17>",
    "almost special: <start_of_turn <end_of_turn>> </div> <div>",
    "Numbers: 0 1 12 123 1234 3.14159 -42 1e10 1,000,000 ٣٤٥ ４２",
    "URL https://example.com/a/b?c=d&e=f#g and email someone@example.org",
    "Mixed: naïve café 🍵 in 東京 at 10:30am — “quotes” ‘single’ … ellipsis",
]

# test_gemma_parity.py: 32 greedy tokens each; the last prompt's logits at its last position
LONG = (
    "The history of computing is a story of abstraction layered on abstraction. "
    "Engineers first wired programs by hand, then wrote them in assembly, then in compiled "
    "languages, and each step let them think about larger problems. "
) * 14 + "In one sentence, the lesson of this history is"

GREEDY_PROMPTS = [
    "What is CUDA?",
    "The capital of France is",
    "def fibonacci(n):\n",
    "Translate to German: The weather is nice today.",
    LONG,
]
GREEDY_TOKENS = 32

# test_gemma_embeddings.py: HF's final hidden states (every position)
EMBEDDING_TEXTS = ["What is CUDA?", "The capital of France is Paris, a city on the Seine."]


def long_document() -> str:
    """test_tokenizer_parity.py's long document."""
    return "\n".join(TOKENIZER_TEXTS) * 20


def vocabulary_digest(vocab: dict[str, int]) -> str:
    """sha256 of a vocabulary's (token, id) pairs in id order."""
    pairs = sorted(vocab.items(), key=lambda item: item[1])
    return hashlib.sha256(json.dumps(pairs, ensure_ascii=False).encode()).hexdigest()


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 24):
            digest.update(block)
    return digest.hexdigest()


@cache
def load(gguf: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """(the JSON reference, the tensors), both checked to be of the file `gguf`."""
    from safetensors import safe_open

    reference = json.loads(JSON_PATH.read_text())
    with safe_open(TENSORS_PATH, "pt") as f:
        made_from = {reference["gguf_sha256"], f.metadata()["gguf_sha256"]}
        tensors = {name: f.get_tensor(name) for name in f.keys()}
    assert made_from == {file_sha256(gguf)}, (
        f"the stored HF reference was made from another GGUF file than {gguf}: {REGENERATE}"
    )
    return reference, tensors
