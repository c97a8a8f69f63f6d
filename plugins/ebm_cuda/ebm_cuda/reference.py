"""The kernels' noise in plain PyTorch: the Philox4x32-10 stream, the ``normal`` and ``uniform`` that the chains'
references (``ebmcore.kernels.fused``: ``langevin_chain_reference(..., normal=normal)``) take.

These are what the tests hold the host and CUDA builds to. Slow (the 32-bit arithmetic runs in
int64 tensors); use them to check, not to sample.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["philox4x32", "normal", "uniform"]

_MASK = 0xFFFFFFFF
_M0, _M1, _W0, _W1 = 0xD2511F53, 0xCD9E8D57, 0x9E3779B9, 0xBB67AE85


def _mulhilo(a: Tensor, m: int) -> tuple[Tensor, Tensor]:
    """High and low 32 bits of ``a * m`` for ``a`` (int64 holding uint32) and a 32-bit constant."""
    p_lo = a * (m & 0xFFFF)  # < 2**48
    p_hi = a * (m >> 16)  # < 2**48
    t = p_lo + ((p_hi & 0xFFFF) << 16)
    return (p_hi >> 16) + (t >> 32), t & _MASK


def philox4x32(counters: Tensor, keys: Tensor) -> Tensor:
    """Philox4x32-10: ``counters: (n, 4)``, ``keys: (n, 2)`` (int64 holding uint32) -> ``(n, 4)``."""
    c0, c1, c2, c3 = (counters[:, i].to(torch.int64) & _MASK for i in range(4))
    k0, k1 = (keys[:, i].to(torch.int64) & _MASK for i in range(2))
    for _ in range(10):
        hi0, lo0 = _mulhilo(c0, _M0)
        hi1, lo1 = _mulhilo(c2, _M1)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0, k1 = (k0 + _W0) & _MASK, (k1 + _W1) & _MASK
    return torch.stack([c0, c1, c2, c3], dim=1)


def _words(n: int, blocks: list[int], seed: int, step: int) -> Tensor:
    """Philox outputs ``(n, len(blocks), 4)`` for chains ``0..n-1`` at ``step``."""
    i = torch.arange(n, dtype=torch.int64).repeat_interleave(len(blocks))
    b = torch.tensor(blocks, dtype=torch.int64).repeat(n)
    counters = torch.stack([b, i, torch.full_like(i, step & _MASK), torch.full_like(i, step >> 32)], dim=1)
    keys = torch.tensor([[seed & _MASK, seed >> 32]], dtype=torch.int64).expand(n * len(blocks), 2)
    return philox4x32(counters, keys).view(n, len(blocks), 4)


def normal(n: int, d: int, seed: int, step: int) -> Tensor:
    """The stream's normals ``(n, d)`` at ``step`` (float32, computed in float64 and rounded)."""
    w = _words(n, list(range((d + 3) // 4)), seed, step).to(torch.float64)
    u1 = (torch.floor(w[..., 0::2] / 256) + 1) * 2.0**-24  # (n, blocks, 2): pairs (w0, w1), (w2, w3)
    u2 = torch.floor(w[..., 1::2] / 256) * 2.0**-24
    r = torch.sqrt(-2.0 * torch.log(u1))
    z = torch.stack([r * torch.cos(2 * math.pi * u2), r * torch.sin(2 * math.pi * u2)], dim=-1)  # (n, blocks, 2, 2)
    return z.reshape(n, -1)[:, :d].to(torch.float32)


def uniform(n: int, seed: int, step: int) -> Tensor:
    """The stream's Metropolis uniforms ``(n,)`` in [0, 1) at ``step`` (float32)."""
    w = _words(n, [0xFFFFFFFF], seed, step)[:, 0, 0]
    return ((w >> 8).to(torch.float64) * 2.0**-24).to(torch.float32)
