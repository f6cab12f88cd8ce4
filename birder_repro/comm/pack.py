"""1-bit packing: eight signs to a byte, and back.

Conventions (fixed, tested against ``numpy.packbits(..., bitorder="little")``):
element ``8k + j`` of the input is bit ``j`` (least significant first) of byte ``k``; bit 1 means +1 and bit
0 means -1. Inputs must hold a multiple of 8 elements: callers pad buckets (see :func:`padded_size`).
"""

from __future__ import annotations

import torch

# Bit i of the little-endian int64 formed by eight 0/1 bytes sits at position 8i. Multiplying by
# sum_i 2^(56 - 7i) moves it to 56 + i; no two partial products share a position (8i - 7j is injective on
# 0..7 x 0..7), so there are no carries and the top byte is the packed byte. One multiply per 8 elements
# instead of eight shifts and ors.
_GATHER = sum(1 << (56 - 7 * i) for i in range(8))
_LUT_CACHE: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}


def padded_size(numel: int, multiple: int) -> int:
    """Smallest multiple of ``multiple`` that holds ``numel`` elements."""
    return -(-numel // multiple) * multiple


def pack_bits(bits: torch.Tensor) -> torch.Tensor:
    """Pack a bool tensor (numel a multiple of 8) into uint8, LSB first."""
    if bits.dtype != torch.bool:
        raise TypeError(f"pack_bits takes a bool tensor, got {bits.dtype}")
    n = bits.numel()
    if n % 8:
        raise ValueError(f"pack_bits needs a multiple of 8 elements, got {n}: pad the bucket first")
    words = bits.contiguous().view(torch.uint8).view(-1, 8)
    if words.storage_offset() % 8:
        words = words.clone()
    words = words.view(torch.int64).view(-1)
    return ((words * _GATHER) >> 56).to(torch.uint8)


def pack_signs(x: torch.Tensor) -> torch.Tensor:
    """Pack the signs of ``x`` (x > 0 is bit 1, meaning +1)."""
    return pack_bits(x > 0)


def sign_table(device: torch.device, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(256, 8) table: row b holds the eight +-1 values that byte b stands for."""
    key = (torch.device(device), dtype)
    if key not in _LUT_CACHE:
        b = torch.arange(256, dtype=torch.int64).unsqueeze(1)
        bits = (b >> torch.arange(8, dtype=torch.int64)) & 1
        _LUT_CACHE[key] = (bits * 2 - 1).to(device=device, dtype=dtype)
    return _LUT_CACHE[key]


def unpack_signs(packed: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Unpack uint8 bytes to +-1 values (8 per byte), keeping leading dimensions: (..., k) -> (..., 8k)."""
    if packed.dtype != torch.uint8:
        raise TypeError(f"unpack_signs takes uint8, got {packed.dtype}")
    table = sign_table(packed.device, dtype)
    out = torch.nn.functional.embedding(packed.reshape(-1).to(torch.int64), table)
    return out.reshape(*packed.shape[:-1], packed.shape[-1] * 8)
