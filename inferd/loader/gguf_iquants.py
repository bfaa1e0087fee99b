"""GGML's codebook and grid types as small integers times a scale per sub-block of 16 or 32.

The i-quants (IQ1_S … IQ4_XS), the ternary TQ1_0/TQ2_0 and the FP4 types MXFP4/NVFP4 store each
weight as an entry of a small table, or each group of 8 (IQ3: 4) weights as a point of a fixed
grid, times a block scale. Every one of them is still `scale * q` with q a small integer, so the
blocks of inferd/layers/gguf_blocks.py hold them without changing a weight:

* IQ4_NL, IQ4_XS, MXFP4, NVFP4: q is the table's value (IQ4: -127 … 113; FP4: the doubled e2m1
  values, -12 … 12), a codebook of at most 16 values.
* IQ2_*, IQ3_*: q is a grid coordinate with its sign bit, ±{8, 25, 43} (IQ2), ±{4, 12, … 62}
  (IQ3_XXS), ±{1, 3, … 15} (IQ3_S). The 7-bit sign indexes of IQ2_XXS, IQ2_XS and IQ3_XXS give
  8 signs, the eighth being the parity of the seven (an even number of minus signs).
* IQ1_S, IQ1_M: weight = dl * (g + delta), g in {-1, 0, 1}, delta = ±1/8; that is
  q = 8 g ± 1 in {±1, ±7, ±9} times dl / 8, exactly (a power of two, far from underflow).
* TQ1_0, TQ2_0: q in {-1, 0, 1} (TQ2_0's fourth code reads 2), the block's fp16 d per 32.

The sub-block scales of the 256-weight types are the block's fp16 d times a small integer, an
exact product in float32 (at most 16 significant bits): `parts` gives them factored, super
(per 256) times sub (int8). Every scale is computed with the reference's float32 operations (or
an exact rewrite of them), so scale * q is bit-identical to the `gguf` package's dequantisers,
NaN and infinity patterns of random scale bytes included (tests/unit/test_gguf_iquants.py).
"""

from __future__ import annotations

import base64
import functools
import math
import zlib
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch

from inferd.layers.gguf_blocks import BlockValues

IQ2_XXS, IQ2_XS, IQ3_XXS, IQ1_S, IQ4_NL, IQ3_S, IQ2_S, IQ4_XS = 16, 17, 18, 19, 20, 21, 22, 23
IQ1_M, TQ1_0, TQ2_0, MXFP4, NVFP4 = 29, 34, 35, 39, 40

IQ4_VALUES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)
FP4_VALUES = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)  # e2m1 doubled: 0 = -0

# Each grid (ggml-common.h's iq2xxs_grid … iq1s_grid) is a set of points of `width` coordinates,
# each one of a few levels, listed in increasing order of the base-k number of the points' level
# indexes (coordinate 0 least significant). Kept as the bitmap of those numbers, zlib-compressed:
# bit v is set where v is one of the grid's points (a few hundred bytes, not 9 KiB of tables).
_GRIDS: dict[int, tuple[tuple[int, ...], int, str]] = {
    IQ2_XXS: ((8, 25, 43), 8, (
        "eNp1UkuqxDAMk8Hdq5B3Hwd6gG7m/ld5tvPt0BENpLHkSG4/f+XDq1ZouUAAaigwxA64afWEFLXbz718+LoBQVCq"
        "n5eSxPakiugoSjpNT6j4xkLlkEakmrdsKvaVVzQcEqXwcY6jlFtvHa9ytE5NdA8erHrVBlu7ptfiaQ4UTzR7t0+D"
        "9Mhgk18I792/MWkMozOpYEUGZTWnjKHk4pUeVVKiD+3yaLJ11MlR6vJsezlRkya9ZIuWJs+Vsrxm3zJ8I6bZP4Xa"
        "FM4G+dvYCpk35szlEWu/YcUTjjHsvjFmaK+qB/ijNp18T/Nl/wr9TfsHxl0VIw=="
    )),
    IQ2_XS: ((8, 25, 43), 8, (
        "eNpdUVuuhTAIHBL6j4nuhyb2vyZ2/1s5PFr13uYcxQLDzDDGuEarR6N7jN6qFMJ9iVYGEbqnDtoZlkIhZkArpNjL"
        "fqNsO5NA1bo8JYAFBDtigJd16QK0VEffvNELHLCRJGDcOCavsBSwVdr3Ft8MzBI/YyQguItPFR+YrVZ4Vig91ZxJ"
        "msCQSjFFFqbnQF6FMyWHrikZp8mrtADNKEt5SwnyPsOM0miHp4hoTq0xX7HOtDckM8rDMHs17BW3p+aFYCbtz+aG"
        "BpShy2TzehJuiNPq30xqNOkvCWeIZyg+If0x2t8iIbnQwY7bDyOfokOFu1z32/oVuavEmHEw5Vjp7gI+vAKcOd2I"
        "zVCwoLfAQE4LqnxJ7h+iL1v+XMoqbTQn0uOl7msKr70o/h/N4W2uYLIu79Po/gBOsClJ"
    )),
    IQ2_S: ((8, 25, 43), 8, (
        "eNptUl2KBiEMa0HfK+h9KozvCvb+V9m0OrvfsivD/MXEJGpmy4a1XPAyh9Xc6l4yLVEpeAwza3usaVZxAVJAq6Yp"
        "pM2cJcyaLT2AlIirZCEipW1rQbmtui2WsEqz9p4y1US+1ivoUAjWzIBAV1vJISY6EP4lcShBm/Zqq+fEhfbsmg9L"
        "aCXMz/QgxS/BAkpmUINcYMOXIGrxTSGOT9yYpnu1Vh9vI1+HvSWP7L7MthfV6UCzvw4hIPVAsBEstKF0IB8QbMGi"
        "P5Er4HetD0G65iMyICUE/BGMWiLJM1qGQ/VNuR2K20hOIF6fghIY3ex4n3JL4FPLO2KGahul7iKdaRzznbS0y8Iu"
        "F4+cfyKzQ/OKg5U5ZHDnVx3K2c/KMLms2JRQPAfAKf90WOQ7NiDh02sg9DEwGad3h46fCTlhJKkX/TCtK8h6O/yV"
        "Gdg1ylcNv5Ur35q+ALm8Vh4="
    )),
    IQ3_XXS: ((4, 12, 20, 28, 36, 44, 52, 62), 4, (
        "eNpNUTEOwjAMPFuxVGUKQ/eKCfGKdGCHH0WdEK9g5Jn4nKZwVdUmPt+dk/llmoBLtrNpgcxqL2xYNlvgEExopeGy"
        "AckfwgsFeMBLimx5bgKYWhSzqa+QDKIVFeeu4jj5ChqqgRTblm/0xzX6nmKbNXGSntCb6DfRq7kbjTtyjSBQy66/"
        "hN+d+2xmUmVXQJrvrAzPhsIYUZoYzGd743mEKqQLVncbdJqUEUMGcbH932U9l6yoo4HjpLQ7QEI8ddpIhIPI7z1c"
        "tL8Nw3X9CxXSe8Mevst9ZNxL7bIcM/FIRlwNpv2O7piB+AIWuhT2"
    )),
    IQ3_S: ((1, 3, 5, 7, 9, 11, 13, 15), 4, (
        "eNotUcFKw0AQfTPMwmZPuyHiNd1GqPmKrdSDeimC+DtpqdD2luIHiFYE+5PObpzDwLw3897b5Od1br+dOV3PD9Ej"
        "ytdDDGeHykbz6M0QaV9LxaAG9/YTySYHhoCvdEYAri/mGWuWp8AVGyzpHKRqSU7VNugiLRq4le4VlqE1Yq3dGW4z"
        "f3k5mt4Mt+bQ1aL8CW7De9Q33DihhC2qTuHOswxkQW9ZRC9bTmQJkF/p39ly7x0ItCLRqIpzONKxhbV3qioBbFrx"
        "CRYJJYaDaXOaIKOwHu6czGxUfMaWBiHvTMy8gR+y3Ee5EqiCRzaYgaxCEgSjJN8LS14gtkvdwY4GeG5tDZKUhXJ3"
        "KJUXm9K1+oxqAGx08Jn00gqR5+yipY9QsMLkm0MX/F9rhEnkBcIeC53rpb6Gi0eXc8T8kWhylcm7/IVJG/gDusYn"
        "IA=="
    )),
    IQ1_S: ((-1, 0, 1), 8, (
        "eNotUkFLnEcYfneq4XVMZWM/QXJ696ux01kR6y3pZZFdWPRiQvIHPNm0SMk5TT4nu+mX2RRCILQ0l3EwyTgNq/FQ"
        "tp+wAU9WemjprQdpPYS6HgJeGgzEzK69zbzwvM/zvM9z7UJUN2zmMlY+c3dJ2/MoKarPR4rKlQsj/YYpSkcBlflA"
        "mnTL8wd+EGLg/r4yWAqoQprMRwGup/AHg4kMk6hO1ZlrWMlNbBvS4yDHnLe4v44oBAQu4QW5hPhj/CVztNu8Z5v+"
        "0s3DTralhlpxtvvn0EMWQ0xOZ1wxBDn7t/08pqKF5dKy1wLjXFA4omigUrhaN8g+dpeopuhqkGEJH81HTGLLqcRU"
        "GaGyi5aJnyTWw3sKKyXoKjQwcxkquU8VaCVxZSrqD5bFqXjGyEug4Re6KVy24t3XoDgyEbMaKKgmprMh/TY1srjz"
        "17NGY8k9DP8bDV0+K6laKwkt0dPObza26z+afx0DBtKlQIlpWCsyk6hpnrVb2btDa4oWNRcdCyvT7OzxamfvddFN"
        "fte+dXj83+2Xr77J9r54+8nJy/Hj4YN/dJz37aGax003qJon2djBnaRvYWLxyPHVIgTLuO+HgSnJn9Kv6t4DJcDC"
        "/eQjUIjwlfZ+iz1ta7PLki+/n/x98yCv8pN+T4z88aQPePcOhLkVUv5iFk/XzEAyCtousOWoHA5VeK56KXsS/ls+"
        "3Eu532C3NjlipmRjSAEtXtdLLe8TIK72d+IClruoAU0joVF3OXopE+BdVMFBb+E+pYqPhgi89XqjwbgMFCrxXKCA"
        "tZTFpj0oWqizuc1gefVN09MVsfizmXqVcBaacH0hFIl5X/Qdu2YsYp6MjkENnabMexVdOwOznuETyH9Y/j/l/lBp"
        "9fyIACBw8Yw6loGqDoiDCM7NVbrdcKynMB3DVPAShkmwzLoLc+8B4wUZaQ=="
    )),
}  # fmt: skip
_GRIDS[IQ1_M] = _GRIDS[IQ1_S]


@functools.cache
def grid(ggml_type: int) -> torch.Tensor:
    """The type's grid as int8 level values [points, width], decoded once."""
    levels, width, encoded = _GRIDS[ggml_type]
    bitmap = np.frombuffer(zlib.decompress(base64.b64decode(encoded)), dtype=np.uint8)
    numbers = torch.from_numpy(np.flatnonzero(np.unpackbits(bitmap, bitorder="little")))
    digits = numbers[:, None] // len(levels) ** torch.arange(width) % len(levels)
    return torch.tensor(levels, dtype=torch.int8)[digits]


@functools.cache
def _parity_signs() -> torch.Tensor:
    """[128, 8] int8 ±1: a 7-bit sign index's bit i is weight i's sign (1: negative), the
    eighth sign the parity of the seven (ggml's ksigns_iq2xs)."""
    bits = (torch.arange(128)[:, None] >> torch.arange(7)) & 1
    bits = torch.cat([bits, bits.sum(1, keepdim=True) & 1], 1)
    return (1 - 2 * bits).to(torch.int8)


def _fp16(pairs: torch.Tensor) -> torch.Tensor:
    """[..., 2] bytes of little-endian fp16 → float32 [...], by numpy's conversion as the
    reference does it: torch's scalar one (a tensor's last few values) turns every NaN into
    0x7FFFFFFF, its vector one keeps sign and payload, so NaN bits would depend on sizes."""
    halves = pairs.contiguous().numpy().view(np.float16)[..., 0]
    return torch.from_numpy(halves.astype(np.float32))


def _half(b: torch.Tensor, start: int) -> torch.Tensor:
    """The fp16 at byte `start` of every block, as a float32 column [n, 1]."""
    return _fp16(b[:, start : start + 2]).unsqueeze(1)


def _words(b: torch.Tensor) -> torch.Tensor:
    """The little-endian unsigned integers of the last dimension's bytes, as int64."""
    return (b.long() << (8 * torch.arange(b.shape[-1]))).sum(-1)


def _bits(b: torch.Tensor) -> torch.Tensor:
    """[..., m] bytes → [..., m, 8]: bit i of each byte, lowest first."""
    return (b.unsqueeze(-1) >> torch.arange(8, dtype=torch.uint8)) & 1


def _nibble_pairs(b: torch.Tensor) -> torch.Tensor:
    """[n, m] bytes → [n, 2m]: byte j's low nibble at 2j, its high nibble at 2j + 1."""
    return torch.stack([b & 0xF, b >> 4], -1).reshape(b.shape[0], -1)


def _halves(b: torch.Tensor) -> torch.Tensor:
    """[..., m] bytes → [..., 2m]: all low nibbles, then all high ones."""
    return torch.cat([b & 0xF, b >> 4], -1)


def _signed(bits: torch.Tensor) -> torch.Tensor:
    return (1 - 2 * bits.to(torch.int8)).to(torch.int8)


class Read(NamedTuple):
    """q int8 [n, S, B] and scale float32 [n, S] of n blocks; `parts`: (super [n, 1], sub
    [n, S]) with scale == super * sub exactly, for the 256-weight types with an fp16 d."""

    q: torch.Tensor
    scale: torch.Tensor
    parts: tuple[torch.Tensor, torch.Tensor] | None = None


def _factored(q: torch.Tensor, d: torch.Tensor, factor: float, sub: torch.Tensor) -> Read:
    """scale = (d * factor) * sub: the reference's d * (sub-ish) * (power of two), reordered,
    which changes no bit: every product is exact (fp16 d times at most 5 bits, no underflow)."""
    super_scale = d * factor
    return Read(q, super_scale * sub.float(), (super_scale, sub.to(torch.int8)))


def _iq2_xxs(b: torch.Tensor) -> Read:
    n = b.shape[0]
    runs = b[:, 2:66].reshape(n, 8, 8)  # per 32 weights: 4 grid indexes, then one 32-bit word
    word = _words(runs[:, :, 4:])  # four 7-bit sign indexes, the 4-bit scale on top
    signs = _parity_signs()[(word[..., None] >> torch.tensor([0, 7, 14, 21])) & 127]
    q = grid(IQ2_XXS)[runs[:, :, :4].long()] * signs
    return _factored(q.reshape(n, 8, 32), _half(b, 0), 0.125, 2 * (word >> 28) + 1)


def _iq2_xs(b: torch.Tensor) -> Read:
    n = b.shape[0]
    codes = _words(b[:, 2:66].reshape(n, 32, 2))  # per 8 weights: 9-bit grid, 7-bit signs
    q = grid(IQ2_XS)[codes & 511] * _parity_signs()[codes >> 9]
    sub = 2 * _nibble_pairs(b[:, 66:74]).long() + 1
    return _factored(q.reshape(n, 16, 16), _half(b, 0), 0.125, sub)


def _iq2_s(b: torch.Tensor) -> Read:
    n = b.shape[0]
    high = (b[:, 66:74, None] >> torch.tensor([0, 2, 4, 6], dtype=torch.uint8)) & 3
    index = b[:, 2:34].long() | (high.reshape(n, 32).long() << 8)
    q = grid(IQ2_S)[index] * _signed(_bits(b[:, 34:66]))
    sub = 2 * _nibble_pairs(b[:, 74:82]).long() + 1
    return _factored(q.reshape(n, 16, 16), _half(b, 0), 0.125, sub)


def _iq3_xxs(b: torch.Tensor) -> Read:
    n = b.shape[0]
    word = _words(b[:, 66:98].reshape(n, 8, 4))  # per 32 weights: 4 sign indexes, the scale
    signs = _parity_signs()[(word[..., None] >> torch.tensor([0, 7, 14, 21])) & 127]
    q = grid(IQ3_XXS)[b[:, 2:66].long()].reshape(n, 8, 32) * signs.reshape(n, 8, 32)
    return _factored(q, _half(b, 0), 0.25, 2 * (word >> 28) + 1)


def _iq3_s(b: torch.Tensor) -> Read:
    n = b.shape[0]
    index = b[:, 2:66].long() | (_bits(b[:, 66:74]).reshape(n, 64).long() << 8)
    q = grid(IQ3_S)[index].reshape(n, 8, 32) * _signed(_bits(b[:, 74:106])).reshape(n, 8, 32)
    return _factored(q, _half(b, 0), 1.0, 2 * _nibble_pairs(b[:, 106:110]).long() + 1)


def _iq1_s(b: torch.Tensor) -> Read:
    n = b.shape[0]
    word = _words(b[:, 34:50].reshape(n, 8, 2))  # per 32 weights: 4 × 3 index bits, the scale
    high = (word[..., None] >> torch.tensor([0, 3, 6, 9])) & 7  # and delta's sign on top
    index = b[:, 2:34].long().reshape(n, 8, 4) | (high << 8)
    delta = _signed(word >> 15)[..., None, None]
    q = (8 * grid(IQ1_S)[index] + delta).reshape(n, 8, 32)
    return _factored(q, _half(b, 0), 0.125, 2 * ((word >> 12) & 7) + 1)


def _iq1_m(b: torch.Tensor) -> Read:
    n = b.shape[0]
    words = _words(b[:, 48:56].reshape(n, 4, 2))  # 4 × 3-bit scales each, a nibble of d on top
    nibbles = (words >> 12) << torch.tensor([0, 4, 8, 12])
    d_bits = nibbles.sum(1, keepdim=True)
    d = _fp16(torch.cat([d_bits & 255, d_bits >> 8], 1).to(torch.uint8)).unsqueeze(1)
    sub = 2 * ((words[..., None] >> torch.tensor([0, 3, 6, 9])) & 7).reshape(n, 16) + 1
    codes = _nibble_pairs(b[:, 32:48]).long()  # per 8 weights: 3 index bits, delta's sign
    index = b[:, 0:32].long() | ((codes & 7) << 8)
    q = 8 * grid(IQ1_M)[index] + _signed(codes >> 3)[..., None]
    return _factored(q.reshape(n, 16, 16), d, 0.125, sub)


def _iq4_nl(b: torch.Tensor) -> Read:
    q = torch.tensor(IQ4_VALUES, dtype=torch.int8)[_halves(b[:, 2:18]).int()]
    return Read(q.view(-1, 1, 32), _half(b, 0))


def _iq4_xs(b: torch.Tensor) -> Read:
    n = b.shape[0]
    high = (_words(b[:, 2:4])[:, None] >> (2 * torch.arange(8))) & 3
    sub = (_nibble_pairs(b[:, 4:8]).long() | (high << 4)) - 32
    q = torch.tensor(IQ4_VALUES, dtype=torch.int8)[_halves(b[:, 8:136].reshape(n, 8, 16)).int()]
    d = _half(b, 0)
    return Read(q, d * sub.float(), (d, sub.to(torch.int8)))


def _trits(b: torch.Tensor, count: int) -> torch.Tensor:
    """[n, m] bytes of 5 (or 4) base-3 digits, stored as ceil(x * 256 / 243) → [n, count * m]:
    digit k of every byte, then digit k + 1 …: (x * 3^k mod 256) * 3 >> 8."""
    powers = 3 ** torch.arange(count, dtype=torch.int16)  # int16: 255 * 81 * 3 fits
    shifted = (b.to(torch.int16)[:, None, :] * powers[None, :, None]) & 255
    return ((shifted * 3) >> 8).reshape(b.shape[0], -1)


def _tq1_0(b: torch.Tensor) -> Read:
    n = b.shape[0]
    q = torch.cat([_trits(b[:, 0:32], 5), _trits(b[:, 32:48], 5), _trits(b[:, 48:52], 4)], 1)
    return Read((q - 1).to(torch.int8).reshape(n, 8, 32), _half(b, 52).expand(n, 8))


def _tq2_0(b: torch.Tensor) -> Read:
    n = b.shape[0]
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8).view(1, 1, 4, 1)
    q = (b[:, 0:64].reshape(n, 2, 1, 32) >> shifts) & 3
    return Read(q.to(torch.int8).reshape(n, 8, 32) - 1, _half(b, 64).expand(n, 8))


def _mxfp4(b: torch.Tensor) -> Read:
    # the E8M0 scale, halved for the doubled e2m1 values: 2^(e - 128), subnormal for e < 2
    e = b[:, :1].to(torch.int32)
    bits = torch.where(e < 2, torch.full_like(e, 0x00200000) << e, (e - 1) << 23)
    q = torch.tensor(FP4_VALUES, dtype=torch.int8)[_halves(b[:, 1:17]).int()]
    return Read(q.view(-1, 1, 32), bits.view(torch.float32))


def _ue4m3_half(x: int) -> float:
    """NVFP4's unsigned E4M3 sub-block scale, halved, as the reference reads it: the top bit
    ignored, 0x7F (E4M3's NaN) zero. Every value is an fp16 value (4 significant bits)."""
    exp, man = (x >> 3) & 15, x & 7
    if x in (0, 0x7F):
        return 0.0
    return (math.ldexp(man, -9) if exp == 0 else math.ldexp(8 + man, exp - 10)) / 2


_UE4M3_HALF = torch.tensor([_ue4m3_half(x) for x in range(256)], dtype=torch.float32)


def _nvfp4(b: torch.Tensor) -> Read:
    n = b.shape[0]
    q = torch.tensor(FP4_VALUES, dtype=torch.int8)[_halves(b[:, 4:36].reshape(n, 4, 8)).int()]
    return Read(q, _UE4M3_HALF[b[:, 0:4].long()])


class _Type(NamedTuple):
    name: str
    layout: tuple[int, int]  # weights, bytes per block
    read: Callable[[torch.Tensor], Read]
    value_range: tuple[int, int]  # of q, whatever a matrix's own values
    half_scales: bool  # the scales are fp16 values (the file's d itself)
    codebook: tuple[int, ...] | None  # q's values, ascending (types of more than 4 of them)
    # bits per weight as gguf_blocks stores the type: q as 4-bit codebook indexes (TQ: 4-bit
    # q), and per sub-block a factored scale (int8, and a float32 per 256), fp16 or float32
    packed_bits: float


def _values(*magnitudes: int) -> tuple[int, ...]:
    return tuple(sorted({s * m for m in magnitudes for s in (-1, 1)}))


_IQ2, _IQ1 = _values(8, 25, 43), _values(1, 7, 9)
_FP4 = tuple(sorted(set(FP4_VALUES)))

TYPES: dict[int, _Type] = {
    IQ2_XXS: _Type("IQ2_XXS", (256, 66), _iq2_xxs, (-43, 43), False, _IQ2, 4.375),
    IQ2_XS: _Type("IQ2_XS", (256, 74), _iq2_xs, (-43, 43), False, _IQ2, 4.625),
    IQ2_S: _Type("IQ2_S", (256, 82), _iq2_s, (-43, 43), False, _IQ2, 4.625),
    IQ3_XXS: _Type("IQ3_XXS", (256, 98), _iq3_xxs, (-62, 62), False,
                   _values(4, 12, 20, 28, 36, 44, 52, 62), 4.375),
    IQ3_S: _Type("IQ3_S", (256, 110), _iq3_s, (-15, 15), False, _values(*range(1, 16, 2)),
                 4.375),
    IQ1_S: _Type("IQ1_S", (256, 50), _iq1_s, (-9, 9), False, _IQ1, 4.375),
    IQ1_M: _Type("IQ1_M", (256, 56), _iq1_m, (-9, 9), False, _IQ1, 4.625),
    IQ4_NL: _Type("IQ4_NL", (32, 18), _iq4_nl, (-127, 113), True, IQ4_VALUES, 4.5),
    IQ4_XS: _Type("IQ4_XS", (256, 136), _iq4_xs, (-127, 113), False, IQ4_VALUES, 4.375),
    TQ1_0: _Type("TQ1_0", (256, 54), _tq1_0, (-1, 1), True, None, 4.5),
    TQ2_0: _Type("TQ2_0", (256, 66), _tq2_0, (-1, 2), True, None, 4.5),
    # MXFP4's scales are powers of two from 2^-128 to 2^127: float32, not fp16
    MXFP4: _Type("MXFP4", (32, 17), _mxfp4, (-12, 12), False, _FP4, 5.0),
    NVFP4: _Type("NVFP4", (64, 36), _nvfp4, (-12, 12), True, _FP4, 5.0),
}  # fmt: skip

# What gguf_quants.py merges into its tables of types.
BLOCK_LAYOUT = {t: spec.layout for t, spec in TYPES.items()}
TYPE_NAMES = {t: spec.name for t, spec in TYPES.items()}
PACKED_BITS = {spec.name: spec.packed_bits for spec in TYPES.values()}


def _unpacker(read: Callable[[torch.Tensor], Read]):
    def unpack(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        q, scale, _ = read(blocks)
        return q, scale.unsqueeze(-1), None

    return unpack


# gguf_quants.py's (q, scale, offset) unpackers
UNPACKERS = {t: _unpacker(spec.read) for t, spec in TYPES.items()}


def block_values(blocks: torch.Tensor, ggml_type: int, rows: int, cols: int) -> BlockValues:
    """[n, bytes] blocks of a [rows, cols] matrix → its BlockValues with the type's storage
    facts: value range, fp16 scales, codebook and the factored scales (see gguf_quants.unpack)."""
    spec = TYPES[ggml_type]
    q, scale, parts = spec.read(blocks)
    group = q.shape[-1]
    if parts is not None:
        parts = (parts[0].reshape(rows, cols // 256), parts[1].reshape(rows, cols // group))
    return BlockValues(q.reshape(rows, cols), scale.reshape(rows, cols // group), None,
                       spec.value_range, spec.half_scales, spec.codebook, parts)  # fmt: skip
