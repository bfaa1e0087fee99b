"""Tiny random GGUF files written by the tests with the `gguf` package: Llama, Qwen2 (q/k/v
bias) and Qwen3 (q/k norms) shapes, quantised to Q8_0, Q5_0, Q4_0 and Q4_1 (every storage width
of inferd's blocks, with and without offsets), with a vocabulary in the file's metadata so that
`LLM(model=path)` runs them (token ids in, token ids out)."""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import pytest

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER, LAYERS, VOCAB = 128, 4, 2, 32, 256, 2, 512


# Fill-in-the-middle tokens a tiny vocabulary may carry (ids 3..8, control tokens), in the roles
# order of inferd/tokenizer/fim.py: Qwen2.5-Coder's names ("names": found by name) or names no
# family uses, which only the GGUF metadata keys identify ("metadata").
FIM_TOKENS = {
    "names": ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|fim_pad|>",
              "<|repo_name|>", "<|file_sep|>"],
    "metadata": ["<f_pre>", "<f_suf>", "<f_mid>", "<f_pad>", "<f_rep>", "<f_sep>"],
}  # fmt: skip


def tiny_writer(path, arch: str, hidden: int = HIDDEN, inter: int = INTER,
                head_dim: int = HEAD_DIM, layers: int = LAYERS,
                fim: str | None = None):  # fmt: skip
    """A GGUFWriter with the metadata of a tiny model of these sizes (HEADS query heads,
    KV_HEADS key/value heads, VOCAB tokens), to which the caller adds the tensors. `fim`: a
    key of FIM_TOKENS, whose tokens take ids 3..8 (None: no FIM tokens)."""
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(layers)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(inter)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_context_length(256)
    # a vocabulary of plain pieces: <unk>, <s>, </s>, then "▁t3" ... (SentencePiece style)
    tokens = ["<unk>", "<s>", "</s>"] + [f"\u2581t{i}" for i in range(3, VOCAB)]
    types = [2, 3, 3] + [1] * (VOCAB - 3)
    if fim is not None:
        tokens[3:9], types[3:9] = FIM_TOKENS[fim], [3] * 6
    if fim == "metadata":
        for i, role in enumerate(("pre", "suf", "mid", "pad", "rep", "sep"), start=3):
            writer.add_uint32(f"tokenizer.ggml.fim_{role}_token_id", i)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * 3 + [-float(i) for i in range(3, VOCAB)])
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    return writer


def write_tiny_gguf(path, arch: str, fim: str | None = None) -> None:
    import gguf
    from gguf.constants import GGMLQuantizationType as T

    rng = np.random.default_rng(0)
    writer = tiny_writer(path, arch, fim=fim)

    def quantised(name, rows, cols, qtype, scale=0.08):
        data = (rng.standard_normal((rows, cols)) * scale).astype(np.float32)
        writer.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)

    def dense(name, n, around=1.0):
        writer.add_tensor(name, (around + 0.1 * rng.standard_normal(n)).astype(np.float32))

    quantised("token_embd.weight", VOCAB, HIDDEN, T.Q8_0, scale=1.0)
    quantised("output.weight", VOCAB, HIDDEN, T.Q4_1)
    dense("output_norm.weight", HIDDEN)
    for i in range(LAYERS):
        p = f"blk.{i}"
        quantised(f"{p}.attn_q.weight", HEADS * HEAD_DIM, HIDDEN, T.Q5_0)
        quantised(f"{p}.attn_k.weight", KV_HEADS * HEAD_DIM, HIDDEN, T.Q5_0)
        quantised(f"{p}.attn_v.weight", KV_HEADS * HEAD_DIM, HIDDEN, T.Q8_0)
        quantised(f"{p}.attn_output.weight", HIDDEN, HEADS * HEAD_DIM, T.Q4_1)
        quantised(f"{p}.ffn_gate.weight", INTER, HIDDEN, T.Q4_0)
        quantised(f"{p}.ffn_up.weight", INTER, HIDDEN, T.Q4_0)
        quantised(f"{p}.ffn_down.weight", HIDDEN, INTER, T.Q8_0)
        dense(f"{p}.attn_norm.weight", HIDDEN)
        dense(f"{p}.ffn_norm.weight", HIDDEN)
        if arch == "qwen2":
            for proj, n in (("q", HEADS), ("k", KV_HEADS), ("v", KV_HEADS)):
                dense(f"{p}.attn_{proj}.bias", n * HEAD_DIM, around=0.0)
        if arch == "qwen3":
            dense(f"{p}.attn_q_norm.weight", HEAD_DIM)
            dense(f"{p}.attn_k_norm.weight", HEAD_DIM)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@contextmanager
def tiny_llama_llm(folder, **engine):
    """An offline engine on a tiny random Llama GGUF written in `folder`, its packed blocks kept
    out of the weight cache; shut down on exit."""
    from inferd import LLM

    path = folder / "tiny-llama.gguf"
    write_tiny_gguf(path, "llama")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("INFERD_WEIGHT_CACHE", "0")  # a test file's blocks stay out of the cache
        llm = LLM(model=str(path), **engine)
        try:
            yield llm
        finally:
            llm.shutdown()
