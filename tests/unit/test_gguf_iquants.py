"""The codebook and grid types (inferd/loader/gguf_iquants.py): IQ1_S … IQ4_XS, TQ1_0, TQ2_0,
MXFP4 and NVFP4 unpacked without changing a weight.

Random blocks of every type (all their bytes random: NaN and infinite scales included) and a few
crafted ones dequantise bit for bit as the `gguf` package's reference does; their unpacked
integers, scales and factored scales rebuild exactly those weights in inferd's blocks; the C
block kernel multiplies by them within the bound its activation rounding implies; GGUF files of
these types open and run, and a type inferd does not know is refused naming the tensor.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from block_definition import exact_product, float_bound, rounding_bound
from tiny_gguf import HEADS, KV_HEADS, VOCAB, tiny_writer

from inferd.errors import ModelLoadError
from inferd.layers.gguf_blocks import BlockWeight
from inferd.loader import gguf_iquants as iq
from inferd.loader import gguf_quants as gq
from inferd.loader.gguf_file import GGUFFile

TYPES = sorted(iq.TYPES)
# byte offset of each type's fp16 d (IQ1_M spreads its d over the top nibbles of bytes 48..56)
D_FIELD = {t: 0 for t in TYPES} | {iq.TQ1_0: 52, iq.TQ2_0: 64}
# largest |weight| / d of each type: random blocks get d ~ 0.1 / this
REACH = {iq.IQ2_XXS: 167, iq.IQ2_XS: 167, iq.IQ2_S: 167, iq.IQ3_XXS: 480, iq.IQ3_S: 465,
         iq.IQ1_S: 17, iq.IQ1_M: 17, iq.IQ4_NL: 127, iq.IQ4_XS: 4064, iq.TQ1_0: 1,
         iq.TQ2_0: 2}  # fmt: skip


def reference(raw: np.ndarray, ggml_type: int) -> torch.Tensor:
    from gguf.constants import GGMLQuantizationType
    from gguf.quants import dequantize

    with np.errstate(all="ignore"):  # NaN and infinite scales are the point
        return torch.from_numpy(dequantize(raw.reshape(-1), GGMLQuantizationType(ggml_type)))


def set_d(blocks: np.ndarray, ggml_type: int, d: np.ndarray) -> None:
    """Write the fp16 values (or their uint16 bits) `d` as each block's d; for MXFP4 and NVFP4,
    `d` is the scale bytes themselves."""
    if ggml_type in (iq.MXFP4, iq.NVFP4):
        width = 1 if ggml_type == iq.MXFP4 else 4
        blocks[:, :width] = d.reshape(len(blocks), -1)
        return
    bits = d.astype(np.float16).view(np.uint16) if d.dtype != np.uint16 else d
    if ggml_type == iq.IQ1_M:
        words = blocks[:, 48:56].copy().view(np.uint16)
        nibbles = (bits[:, None] >> np.array([0, 4, 8, 12], dtype=np.uint16)) & 0xF
        blocks[:, 48:56] = ((words & 0x0FFF) | (nibbles << 12)).view(np.uint8)
        return
    start = D_FIELD[ggml_type]
    blocks[:, start : start + 2] = bits.view(np.uint8).reshape(-1, 2)


def random_blocks(ggml_type: int, count: int, seed: int = 0, finite: bool = False) -> np.ndarray:
    """[count, bytes] random blocks; `finite`: with scales that give weights of about ±0.1."""
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(count, iq.TYPES[ggml_type].layout[1]), dtype=np.uint8)
    if finite:
        if ggml_type == iq.MXFP4:  # 2^(e - 128) * 12 ~ 0.1
            set_d(blocks, ggml_type, rng.integers(118, 122, count, dtype=np.uint8))
        elif ggml_type == iq.NVFP4:  # (8 + m) 2^(e - 11), e = 1..2: up to 0.015 * 12
            set_d(blocks, ggml_type, rng.integers(0x08, 0x18, 4 * count, dtype=np.uint8))
        else:
            set_d(blocks, ggml_type, rng.uniform(-0.1, 0.1, count) / REACH[ggml_type])
    return blocks


def edge_blocks(ggml_type: int) -> np.ndarray:
    """Blocks of all zeros and all ones, and random blocks with special scales: infinities,
    -0, the smallest fp16 subnormal, the largest finite fp16, NaNs with a payload; for MXFP4 and
    NVFP4 the ends of their scale codes."""
    count = 10
    blocks = random_blocks(ggml_type, count, seed=1)
    blocks[0], blocks[1] = 0, 255
    if ggml_type == iq.MXFP4:
        d = np.array([0, 255, 0, 1, 2, 127, 128, 254, 255, 3], dtype=np.uint8)
    elif ggml_type == iq.NVFP4:  # 0x7F reads 0, 0xFF reads 240: the reference's top bit
        d = np.array([0x00, 0x7F, 0xFF, 0x80, 0x01, 0x7E, 0x87, 0xF8, 0x08, 0x77] * 4,
                     dtype=np.uint8)  # fmt: skip
    else:
        # the last two NaNs, a quiet and a signalling one
        specials = [0x0000, 0xFFFF, 0x7C00, 0xFC00, 0x8000, 0x0001, 0x7BFF, 0x3C00, 0x7E01,
                    0xFD55]  # fmt: skip
        d = np.array(specials, dtype=np.uint16)
    set_d(blocks, ggml_type, d)
    return blocks


def test_the_types_are_the_formats():
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    for t in TYPES:
        assert gq.BLOCK_LAYOUT[t] == GGML_QUANT_SIZES[GGMLQuantizationType(t)]
        assert gq.type_name(t) == GGMLQuantizationType(t).name
        assert gq.is_block_quantized(t) and gq.PACKED_BITS[gq.type_name(t)] > 0


# entries of ggml-common.h's tables: coordinate i is byte i of the little-endian word
GGML_GRID_ENTRIES = {
    iq.IQ2_XXS: {1: 0x080808080808082B, 255: 0x2B2B2B1908081908},
    iq.IQ2_XS: {3: 0x0808080808082B08, 511: 0x2B2B2B2B2B2B2B2B},
    iq.IQ2_S: {5: 0x0808080808190819, 1023: 0x2B2B2B2B2B2B2B2B},
    iq.IQ3_XXS: {5: 0x04040C3E, 255: 0x3E341C04},
    iq.IQ3_S: {3: 0x0101010B, 511: 0x0F0F0101},
    iq.IQ1_S: {1: 0xFFFFFFFFFFFFFF01, 2: 0xFFFFFFFFFFFF0000, 2047: 0x0101010101010101},
}


@pytest.mark.parametrize("ggml_type", sorted(GGML_GRID_ENTRIES), ids=gq.type_name)
def test_the_grids_are_ggmls(ggml_type):
    import gguf.quants

    grid = iq.grid(ggml_type)
    for i, word in GGML_GRID_ENTRIES[ggml_type].items():
        entry = word.to_bytes(grid.shape[1], "little")
        assert grid[i].tolist() == list(np.frombuffer(entry, dtype=np.int8)), i
    ref = getattr(gguf.quants, gq.type_name(ggml_type))
    ref.init_grid()
    assert torch.equal(grid.float(), torch.from_numpy(ref.grid.reshape(grid.shape)))


@pytest.mark.parametrize("ggml_type", TYPES, ids=gq.type_name)
def test_dequantisation_is_the_references_bit_for_bit(ggml_type):
    edges = edge_blocks(ggml_type)
    raw = np.concatenate([random_blocks(ggml_type, 2048), edges])
    # and each edge block alone: torch converts the last few values of a tensor otherwise
    for blocks in [raw, *np.split(edges, len(edges))]:
        expected = reference(blocks, ggml_type)
        shape = (len(blocks), iq.TYPES[ggml_type].layout[0])
        got = gq.dequantize(blocks.reshape(-1), ggml_type, shape).flatten()
        assert torch.equal(got.view(torch.int32), expected.view(torch.int32))
    if ggml_type not in (iq.MXFP4, iq.NVFP4):  # those have no fp16 scale to be NaN
        assert expected.isnan().any() and reference(raw, ggml_type).isinf().any()


@pytest.mark.parametrize("ggml_type", TYPES, ids=gq.type_name)
def test_unpacked_values_rebuild_the_weights(ggml_type):
    spec = iq.TYPES[ggml_type]
    rows, cols = 32, 512  # two whole groups of 16 rows
    raw = random_blocks(ggml_type, rows * cols // spec.layout[0], finite=True).reshape(-1)
    dense = gq.dequantize(raw, ggml_type, (rows, cols))
    assert torch.equal(dense.flatten(), reference(raw, ggml_type))
    values = gq.unpack(raw, ggml_type, (rows, cols))
    q, scale = values.q, values.scale
    assert q.dtype == torch.int8 and q.shape == (rows, cols)
    lo, hi = values.value_range
    assert lo <= int(q.min()) and int(q.max()) <= hi
    if values.codebook is not None:
        assert len(values.codebook) <= 16 and list(values.codebook) == sorted(values.codebook)
        assert set(q.unique().tolist()) <= set(values.codebook)
        assert {lo, hi} <= set(values.codebook)
    if values.half_scales:
        assert torch.equal(scale.half().float(), scale)
    if values.scale_parts is not None:
        super_scale, sub = values.scale_parts
        group = cols // scale.shape[1]
        assert super_scale.shape == (rows, cols // 256) and sub.dtype == torch.int8
        per_block = super_scale.repeat_interleave(256 // group, 1)
        assert torch.equal(per_block * sub.float(), scale)
    w = BlockWeight(*values)
    assert torch.equal(w.dequantized(), dense)
    assert torch.equal(w.dequantized(torch.tensor([7, 30, 7])), dense[[7, 30, 7]])
    # stored in the bits per weight the memory plan counts (but for a codebook's 16 bytes)
    bits = w.nbytes * 8 / (rows * cols)
    assert gq.PACKED_BITS[spec.name] <= bits <= gq.PACKED_BITS[spec.name] + 16 * 8 / (rows * cols)


@pytest.mark.parametrize("ggml_type", TYPES, ids=gq.type_name)
def test_the_block_kernel_multiplies_by_them(c_kernels, ggml_type):
    rows, cols = 22, 512  # a last group of six rows
    raw = random_blocks(ggml_type, rows * cols // iq.TYPES[ggml_type].layout[0], 2, True)
    w = BlockWeight(*gq.unpack(raw.reshape(-1), ggml_type, (rows, cols)))
    torch.manual_seed(ggml_type)
    x = torch.randn(5, cols)
    y = w(x)
    assert ((y.double() - exact_product(x, w)).abs() <= float_bound(x, w)).all()
    exact = x.double() @ w.dequantized().double().t()
    assert ((y.double() - exact).abs() <= rounding_bound(x, w) + float_bound(x, w)).all()


def write_tensors(path, tensors: dict[str, tuple[int, np.ndarray]]) -> None:
    """A GGUF file of `name: (ggml type, [rows, bytes] blocks)` tensors and no model."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    for name, (ggml_type, blocks) in tensors.items():
        writer.add_tensor(name, blocks, raw_dtype=gguf.GGMLQuantizationType(ggml_type))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_a_file_of_these_types_opens_with_their_sizes(tmp_path):
    path = tmp_path / "types.gguf"
    tensors = {}
    for t in TYPES:
        block, nbytes = iq.TYPES[t].layout
        tensors[f"t{t}"] = (t, random_blocks(t, 3 * 512 // block, t).reshape(3, -1))
    write_tensors(path, tensors)
    gguf = GGUFFile(path)
    for name, (t, blocks) in tensors.items():
        info = gguf.tensors[name]
        assert (info.ggml_type, info.shape, info.n_bytes) == (t, (3, 512), blocks.size)
        got = gq.dequantize(gguf.raw(name), t, info.shape)
        assert torch.equal(got.flatten().view(torch.int32), reference(blocks, t).view(torch.int32))


def test_a_type_inferd_does_not_know_is_refused_naming_it_and_the_tensor(tmp_path):
    path = tmp_path / "unknown.gguf"
    write_tensors(path, {"blk.0.mystery.weight": (gq.Q8_0, np.zeros((2, 34), np.uint8))})
    data = bytearray(path.read_bytes())
    name = b"blk.0.mystery.weight"
    at = data.index(name) + len(name) + 4 + 2 * 8  # after the name, n_dims and two dims
    assert int.from_bytes(data[at : at + 4], "little") == gq.Q8_0
    data[at : at + 4] = (99).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    with pytest.raises(ModelLoadError, match=r"'blk.0.mystery.weight' uses ggml type 99, which "
                       r"inferd cannot dequantise; supported: .*IQ2_XXS"):  # fmt: skip
        GGUFFile(path)


HIDDEN, HEAD_DIM, INTER = 256, 64, 512
# every type: the embedding, each layer's q, k, v, o, gate, up and down (q/k/v and gate/up of
# different storage layouts in layer 1), the output
LAYOUT = [iq.MXFP4, iq.IQ4_XS, iq.IQ4_XS, iq.IQ2_XXS, iq.TQ2_0, iq.IQ2_XXS, iq.TQ1_0, iq.MXFP4,
          iq.IQ3_S, iq.IQ1_M, iq.NVFP4, iq.IQ4_NL, iq.IQ2_S, iq.IQ3_XXS, iq.IQ1_S,
          iq.IQ2_XS]  # fmt: skip


def write_model(path) -> None:
    import gguf

    rng = np.random.default_rng(0)
    writer = tiny_writer(path, "llama", HIDDEN, INTER, HEAD_DIM, layers=2)
    types = iter(LAYOUT)

    def matrix(name: str, rows: int, cols: int) -> None:
        t = next(types)
        qtype = gguf.GGMLQuantizationType(t)
        if t in (iq.MXFP4, iq.TQ2_0):  # the gguf package quantises these
            data = (rng.standard_normal((rows, cols)) * 0.05).astype(np.float32)
            writer.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
        else:  # random valid blocks (no quantiser in the package)
            blocks = random_blocks(t, rows * cols // iq.TYPES[t].layout[0], len(name), True)
            writer.add_tensor(name, blocks.reshape(rows, -1), raw_dtype=qtype)

    def norm(name: str) -> None:
        writer.add_tensor(name, (1 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32))

    matrix("token_embd.weight", VOCAB, HIDDEN)
    for i in range(2):
        p = f"blk.{i}"
        matrix(f"{p}.attn_q.weight", HEADS * HEAD_DIM, HIDDEN)
        matrix(f"{p}.attn_k.weight", KV_HEADS * HEAD_DIM, HIDDEN)
        matrix(f"{p}.attn_v.weight", KV_HEADS * HEAD_DIM, HIDDEN)
        matrix(f"{p}.attn_output.weight", HIDDEN, HEADS * HEAD_DIM)
        matrix(f"{p}.ffn_gate.weight", INTER, HIDDEN)
        matrix(f"{p}.ffn_up.weight", INTER, HIDDEN)
        matrix(f"{p}.ffn_down.weight", HIDDEN, INTER)
        norm(f"{p}.attn_norm.weight")
        norm(f"{p}.ffn_norm.weight")
    matrix("output.weight", VOCAB, HIDDEN)
    norm("output_norm.weight")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.slow
def test_a_model_of_these_types_generates(tmp_path, monkeypatch, c_kernels):
    from inferd import LLM, SamplingParams

    monkeypatch.setenv("INFERD_WEIGHT_CACHE", "0")  # a tiny file: keep it out of the cache
    path = tmp_path / "iquants.gguf"
    write_model(path)
    assert sorted({info.ggml_type for info in GGUFFile(path).tensors.values()}) == [0, *TYPES]
    llm = LLM(model=str(path), kv_cache_memory=16 << 20)
    model = llm.engine.runner.model
    assert model.cpu_decoder is not None  # the blocks, by the C kernels
    # every matrix kept as blocks: the embedding, q/k/v, o, gate/up, down of each layer, output
    assert sum(isinstance(m, BlockWeight) for m in model.modules()) == 1 + 2 * 4 + 1
    params = SamplingParams(max_tokens=4, temperature=0.0, logprobs=3, ignore_eos=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        (out,) = llm.generate([[1, 5, 17, 300]], params, use_tqdm=False)
    completion = out.outputs[0]
    assert len(completion.token_ids) == 4
    logprobs = [lp.logprob for position in completion.logprobs for lp in position.values()]
    assert logprobs and np.isfinite(logprobs).all()
