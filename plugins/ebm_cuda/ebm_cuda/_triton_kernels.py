"""The Triton kernels of :mod:`ebm_cuda.triton_chains` (this module imports triton: import it only through
``triton_chains._kernels()``, which does so on first use). Documented in :mod:`ebm_cuda.triton_chains`."""

from __future__ import annotations

from typing import Optional, Sequence

import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction
from torch import Tensor

from ebmcore.energies.program import ActivationKind
from ebmcore.errors import InputError
from ebm_cuda.activations import ACTIVATION_CODES, decode

__all__ = ["langevin_kernel", "normals_kernel", "launch_langevin", "launch_normals", "noise_columns", "COMPILED"]

_U24 = tl.constexpr(5.9604644775390625e-08)  # 2**-24
_TWO_PI = tl.constexpr(6.283185307179586)
_MINUS_LOG2_E = tl.constexpr(-1.4426950408889634)  # exp(−x) = 2^(x·−log₂e)

# the activation codes of the one table (ebm_cuda.activations: the host build's EBM_ACTIVATIONS)
_SILU = tl.constexpr(ACTIVATION_CODES[ActivationKind.SILU])
_TANH = tl.constexpr(ACTIVATION_CODES[ActivationKind.TANH])
_SIGMOID = tl.constexpr(ACTIVATION_CODES[ActivationKind.SIGMOID])
_RELU = tl.constexpr(ACTIVATION_CODES[ActivationKind.RELU])
_LEAKY_RELU = tl.constexpr(ACTIVATION_CODES[ActivationKind.LEAKY_RELU])
_ELU = tl.constexpr(ACTIVATION_CODES[ActivationKind.ELU])


@triton.jit
def _activation(z, ACT: tl.constexpr, PARAM: tl.constexpr, PTX_MATH: tl.constexpr):
    """``(f(z), f'(z))`` for the activation of kind ``ACT`` (:data:`ebm_cuda.activations.ACTIVATION_CODES`) with its
    parameter ``PARAM`` (leaky ReLU's slope, ELU's alpha; 0.0 for the others); exponentials and reciprocals by
    :func:`_exp_minus` and :func:`_reciprocal`."""
    if ACT == _SILU:
        sg = _sigmoid(z, PTX_MATH)
        f = z * sg
        df = sg + f * (1.0 - sg)
    elif ACT == _TANH:
        e = _exp_minus(2.0 * tl.abs(z), PTX_MATH)
        t = (1.0 - e) * _reciprocal(1.0 + e, PTX_MATH)
        f = tl.where(z < 0, -t, t)
        df = 1.0 - t * t
    elif ACT == _SIGMOID:
        f = _sigmoid(z, PTX_MATH)
        df = f * (1.0 - f)
    elif ACT == _RELU:
        f = tl.maximum(z, 0.0)
        df = tl.where(z > 0, 1.0, 0.0)
    elif ACT == _LEAKY_RELU:
        f = tl.where(z > 0, z, z * PARAM)
        df = tl.where(z > 0, 1.0, PARAM)
    else:
        tl.static_assert(ACT == _ELU, "an activation of the table without its branch here")
        e = PARAM * _exp_minus(-tl.minimum(z, 0.0), PTX_MATH)
        f = tl.where(z > 0, z, e - PARAM)
        df = tl.where(z > 0, 1.0, e)
    return f, df


@triton.jit
def _sigmoid(z, PTX_MATH: tl.constexpr):
    """``1 / (1 + exp(−z))``, float32."""
    return _reciprocal(1.0 + _exp_minus(z, PTX_MATH), PTX_MATH)


# With ``PTX_MATH`` (the compiled kernels) an exponential or a reciprocal is one instruction of the GPU's special
# function unit: ``ex2.approx.ftz.f32``, ``rcp.approx.ftz.f32``. Triton's ``tl.exp`` (``ex2.approx.f32``) and float32
# division (``div.full.f32``) run the same units (MUFU.EX2, MUFU.RCP) with range tests, selects and scalings around
# them that keep subnormal operands and results. Flushing those to 0 changes no activation (an exponential is only
# added to 1 or more). SiLU with its derivative: 16 instructions → 7; by the step loop's instructions
# (``benchmarks/triton_static.py``, sm_90, 2-64-64-1 chain): bfloat16 products 92 → 60 warp-instructions per
# chain-step, TF32 111 → 77, IEEE 538 → 505. Triton's interpreter runs no PTX: there (``PTX_MATH`` False) the kernels
# compute ``tl.exp`` and a division.
@triton.jit
def _exp_minus(x, PTX_MATH: tl.constexpr):
    """``exp(−x)``, float32 (the sign in the factor: Triton's ``-x`` is ``0 − x``, one instruction more)."""
    if PTX_MATH:
        y = tl.inline_asm_elementwise(
            "ex2.approx.ftz.f32 $0, $1;", "=f,f", [x * _MINUS_LOG2_E], dtype=tl.float32, is_pure=True, pack=1
        )
    else:
        y = tl.exp(-x)
    return y


@triton.jit
def _reciprocal(x, PTX_MATH: tl.constexpr):
    """``1 / x``, float32."""
    if PTX_MATH:
        y = tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=tl.float32, is_pure=True, pack=1)
    else:
        y = 1.0 / x
    return y


@triton.jit
def _dot(a, b, PRECISION: tl.constexpr):
    """``a @ b`` accumulated in float32: IEEE, split TF32 or TF32 products (Triton's ``input_precision``; Triton's
    interpreter computes all three in float32), or, for ``"bf16"``, the operands rounded to bfloat16 (to nearest even).
    ``"bf16-emulated"``, what the launcher asks for under the interpreter (whose bfloat16 ``tl.dot`` multiplies the bit
    patterns: triton-lang/triton#11584), computes the same exact products of the rounded operands in float32."""
    if PRECISION == "bf16":
        out = tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16), out_dtype=tl.float32)
    elif PRECISION == "bf16-emulated":
        out = tl.dot(_round_to_bfloat16(a), _round_to_bfloat16(b), input_precision="ieee")
    else:
        out = tl.dot(a, b, input_precision=PRECISION)
    return out


@triton.jit
def _round_to_bfloat16(x):
    """``x`` (float32) rounded to the nearest bfloat16, ties to even, as ``Tensor.to`` rounds, NaN kept: a float32 that
    bfloat16 holds exactly, so the conversion that follows is exact however it rounds (the interpreter truncates)."""
    bits = x.to(tl.uint32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return tl.where(x != x, x, bits.to(tl.float32, bitcast=True))


@triton.jit
def _normals(seed_lo, seed_hi, rows, t, D: tl.constexpr, BLOCK_N: tl.constexpr):
    """The stream's normals ``(BLOCK_N, D)`` of chains ``rows`` at step ``t`` (int64): element ``j`` is normal
    ``j mod 4`` of Philox4x32-10(key ``(seed_lo, seed_hi)``, counter ``(j // 4, row, t mod 2^32, t // 2^32)``) by
    Box–Muller."""
    q = tl.arange(0, D // 4)
    c0 = tl.zeros((BLOCK_N, D // 4), dtype=tl.uint32) + q[None, :].to(tl.uint32)
    c1 = tl.zeros((BLOCK_N, D // 4), dtype=tl.uint32) + rows[:, None].to(tl.uint32)
    c2 = tl.zeros((BLOCK_N, D // 4), dtype=tl.uint32) + (t & 0xFFFFFFFF).to(tl.uint32)
    c3 = tl.zeros((BLOCK_N, D // 4), dtype=tl.uint32) + (t >> 32).to(tl.uint32)
    w0, w1, w2, w3 = tl.philox_impl(c0, c1, c2, c3, seed_lo.to(tl.uint32), seed_hi.to(tl.uint32))
    u1a = ((w0 >> 8) + 1).to(tl.float32) * _U24
    u2a = (w1 >> 8).to(tl.float32) * _U24
    u1b = ((w2 >> 8) + 1).to(tl.float32) * _U24
    u2b = (w3 >> 8).to(tl.float32) * _U24
    ra = tl.sqrt(-2.0 * tl.log(u1a))
    rb = tl.sqrt(-2.0 * tl.log(u1b))
    z0 = ra * tl.cos(u2a * _TWO_PI)
    z1 = ra * tl.sin(u2a * _TWO_PI)
    z2 = rb * tl.cos(u2b * _TWO_PI)
    z3 = rb * tl.sin(u2b * _TWO_PI)
    z = tl.join(tl.join(z0, z2), tl.join(z1, z3))  # (BLOCK_N, D // 4, 2, 2): [.., k, m] is normal 2k + m
    return tl.reshape(z, (BLOCK_N, D))


@triton.jit
def _langevin_move(
    x,
    grad,
    hs,
    ss,
    k,
    offset,
    noise_ptr,
    n,
    d,
    rows,
    rows64,
    cols,
    mask,
    col_ok,
    seed_lo,
    seed_hi,
    D0: tl.constexpr,
    DN: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NOISE_FROM_TENSOR: tl.constexpr,
):
    """The ``k``-th move ``x − h·grad + s·ξ`` of a call, ``ξ`` from the stream at step ``offset + k`` (or read from the
    noise tensor). The stream's normals are drawn for the first ``DN`` columns only (``DN ≥ d``, a power of 2, at least
    4: one Philox block), then widened with zeros to the ``D0`` columns of the state."""
    if NOISE_FROM_TENSOR:
        xi = tl.load(noise_ptr + (n.to(tl.int64) * k + rows64)[:, None] * d + cols[None, :], mask=mask, other=0.0)
    else:
        xi = _widened(_normals(seed_lo, seed_hi, rows, offset + k, DN, BLOCK_N), DN, D0, BLOCK_N)
    return x - hs * grad + ss * tl.where(col_ok[None, :], xi, 0.0)


@triton.jit
def _widened(z, DN: tl.constexpr, D0: tl.constexpr, BLOCK_N: tl.constexpr):
    """``z: (BLOCK_N, DN)`` followed by zeros to ``(BLOCK_N, D0)`` (powers of 2, ``DN ≤ D0``): doubled by
    ``join(z, 0)``, its last two axes swapped, until wide enough."""
    for _ in tl.static_range(4):  # from 4 columns to 64 at most
        if z.shape[1] < D0:
            z = tl.reshape(tl.permute(tl.join(z, tl.zeros_like(z)), (0, 2, 1)), (BLOCK_N, 2 * z.shape[1]))
    tl.static_assert(z.shape[1] == D0)
    return z


@triton.jit
def _stored(x, DTYPE: tl.constexpr):
    """``x`` (float32) as the state is stored: rounded to ``DTYPE`` (bfloat16 to nearest even)."""
    if DTYPE == tl.bfloat16:
        y = _round_to_bfloat16(x).to(tl.bfloat16)
    else:
        y = x.to(DTYPE)
    return y


@triton.jit
def _contribute(
    part_ptr,
    e_ptr,
    a_ptr,
    b_ptr,
    bo_ptr,
    side,
    pid,
    n,
    rows,
    row_ok,
    x,
    a1,
    e1,
    a2,
    e2,
    a3,
    e3,
    wo,
    D0: tl.constexpr,
    H1: tl.constexpr,
    H2: tl.constexpr,
    H3: tl.constexpr,
    N_HIDDEN: tl.constexpr,
    HAS_B: tl.constexpr,
    P: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """The energies ``E = wo·a_top + bo`` (``bo`` at ``bo_ptr``: the output bias times the sign) of the block's chains
    at one end (``side`` 0: the starts, 1: the ends), stored at ``e_ptr + side·n``, and the block's part of
    ``Σᵣ cᵣ ∂Eᵣ/∂θ``, ``c = a + b·E`` (``b = 0``: ``c = a``), over its rows, stored in slot ``2·pid + side`` of the
    partial sums (``P`` floats: per hidden layer ``W_l`` then ``b_l``, padded, then ``Σ c·a_top`` for the output
    weights, before the energy's sign). ``a_l = f(z_l)``, ``e_l = ∂E/∂z_l``; beyond ``N_HIDDEN`` any tensors (unread)."""
    if N_HIDDEN == 1:
        top = a1
    elif N_HIDDEN == 2:
        top = a2
    else:
        top = a3
    energy = tl.sum(top * wo[None, :], axis=1) + tl.load(bo_ptr)
    at = side.to(tl.int64) * n + rows  # (2, n) buffers: side·n + row past 2³¹ where n > 2³⁰
    tl.store(e_ptr + at, energy, mask=row_ok)
    c = tl.load(a_ptr + at, mask=row_ok, other=0.0)
    if HAS_B:
        b = tl.load(b_ptr + at, mask=row_ok, other=0.0)
        c = c + tl.where(b == 0.0, 0.0, b * energy)
    c = tl.where(row_ok, c, 0.0)[:, None]
    base = part_ptr + (2 * pid + side).to(tl.int64) * P
    at = _store_layer_part(base, c * e1, x, H1, D0, PRECISION)
    if N_HIDDEN >= 2:
        at = _store_layer_part(at, c * e2, a1, H2, H1, PRECISION)
    if N_HIDDEN >= 3:
        at = _store_layer_part(at, c * e3, a2, H3, H2, PRECISION)
    tl.store(at + tl.arange(0, H1 if N_HIDDEN == 1 else (H2 if N_HIDDEN == 2 else H3)), tl.sum(c * top, axis=0))


@triton.jit
def _store_layer_part(at, ce, inputs, H: tl.constexpr, K: tl.constexpr, PRECISION: tl.constexpr):
    """A hidden layer's part of the block's sums at ``at``: its weights' ``Σᵣ ceᵣ ⊗ inputsᵣ`` (``H × K``) then its
    biases' ``Σᵣ ceᵣ`` (``H``); returns where the next layer's part starts."""
    h = tl.arange(0, H)
    if (PRECISION == "bf16") | (PRECISION == "bf16-emulated"):  # TF32 products of the rounded operands (the same values):
        # triton_launch.CONTRASTIVE_BF16
        part = tl.dot(_round_to_bfloat16(tl.trans(ce)), _round_to_bfloat16(inputs), input_precision="tf32")
    else:
        part = _dot(tl.trans(ce), inputs, PRECISION)
    tl.store(at + h[:, None] * K + tl.arange(0, K)[None, :], part)
    tl.store(at + H * K + h, tl.sum(ce, axis=0))
    return at + H * (K + 1)


# 64-bit seeds and steps travel as int32 halves (Triton types an int argument by its value: steps in [2³¹, 2³²), typed uint32,
# gave wrong counters under the interpreter): seed = seed_hi·2³² + seed_lo (bit patterns), offset = offset_hi·2³¹ + offset_lo.
@triton.jit(
    do_not_specialize=["n", "d", "stride_x", "stride_out", "n_steps", "h", "s", "seed_lo", "seed_hi", "offset_lo", "offset_hi"]
)
def langevin_kernel(
    x_ptr,
    out_ptr,
    noise_ptr,
    hv_ptr,
    sv_ptr,
    w1_ptr,
    b1_ptr,
    w2_ptr,
    b2_ptr,
    w3_ptr,
    b3_ptr,
    wo_ptr,
    a_ptr,
    b_ptr,
    bo_ptr,
    e_ptr,
    part_ptr,
    n,
    d,
    stride_x,
    stride_out,
    n_steps,
    h,
    s,
    seed_lo,
    seed_hi,
    offset_lo,
    offset_hi,
    D0: tl.constexpr,
    DN: tl.constexpr,
    H1: tl.constexpr,
    H2: tl.constexpr,
    H3: tl.constexpr,
    N_HIDDEN: tl.constexpr,
    ACT1: tl.constexpr,
    ACT2: tl.constexpr,
    ACT3: tl.constexpr,
    PARAM1: tl.constexpr,
    PARAM2: tl.constexpr,
    PARAM3: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NOISE_FROM_TENSOR: tl.constexpr,
    PER_CHAIN_H: tl.constexpr,
    PER_CHAIN_S: tl.constexpr,
    PRECISION: tl.constexpr,
    CONTRASTIVE: tl.constexpr,
    HAS_B: tl.constexpr,
    P: tl.constexpr,
    PTX_MATH: tl.constexpr,
):
    """``n_steps`` Langevin steps of ``BLOCK_N`` chains per program (hidden layer ``l``'s activation: kind ``ACTl``
    with parameter ``PARAMl``); weights padded (``H1 × D0``, ...), the output
    weights already multiplied by the energy's sign; ``N_HIDDEN`` in 1..3 (the unused pointers are not read); the
    stream's normals drawn for the first ``DN`` columns (:func:`noise_columns`).

    ``CONTRASTIVE`` (``n_steps >= 1``): the same steps, and one pass more at the ends; the passes at the starts (the
    first step's own) and at the ends also store the energies and the block's part of the weight gradient
    (:func:`_contribute`; ``a_ptr``, ``b_ptr``: the coefficients ``(2, n)``, ``bo_ptr``: the output bias times the
    sign, ``e_ptr``: the energies ``(2, n)``, ``part_ptr``: the partial sums ``(2·programs, P)``). Without it those
    pointers are not read."""
    pid = tl.program_id(0)
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.arange(0, D0)
    row_ok = rows < n
    col_ok = cols < d
    mask = row_ok[:, None] & col_ok[None, :]
    rows64 = rows.to(tl.int64)
    x = tl.load(x_ptr + rows64[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)

    if PER_CHAIN_H:
        hs = tl.load(hv_ptr + rows, mask=row_ok, other=0.0)[:, None]
    else:
        hs = h
    if PER_CHAIN_S:
        ss = tl.load(sv_ptr + rows, mask=row_ok, other=0.0)[:, None]
    else:
        ss = s

    # the weights, read once per program and held across the steps
    k1 = tl.arange(0, H1)
    w1 = tl.load(w1_ptr + k1[:, None] * D0 + cols[None, :])  # (H1, D0)
    b1 = tl.load(b1_ptr + k1)
    if N_HIDDEN >= 2:
        k2 = tl.arange(0, H2)
        w2 = tl.load(w2_ptr + k2[:, None] * H1 + k1[None, :])  # (H2, H1)
        b2 = tl.load(b2_ptr + k2)
    if N_HIDDEN >= 3:
        k3 = tl.arange(0, H3)
        w3 = tl.load(w3_ptr + k3[:, None] * H2 + k2[None, :])  # (H3, H2)
        b3 = tl.load(b3_ptr + k3)
    if N_HIDDEN == 1:
        wo = tl.load(wo_ptr + k1)
    elif N_HIDDEN == 2:
        wo = tl.load(wo_ptr + k2)
    else:
        wo = tl.load(wo_ptr + k3)
    offset = offset_hi.to(tl.int64) * 2147483648 + offset_lo.to(tl.int64)
    if CONTRASTIVE:
        n_passes = n_steps + 1  # the last pass, at the ends, makes no move
    else:
        n_passes = n_steps
    for k in range(n_passes):
        if CONTRASTIVE:
            if k == n_steps:  # the ends' pass sees the states as they are stored, and the padded rows back at 0: their
                # moves may have overflowed, and 0·inf would reach the block's sums
                x = tl.where(row_ok[:, None], _stored(x, out_ptr.dtype.element_ty).to(tl.float32), 0.0)
        z1 = _dot(x, tl.trans(w1), PRECISION) + b1[None, :]
        a1, d1 = _activation(z1, ACT1, PARAM1, PTX_MATH)
        if N_HIDDEN == 1:
            e1 = d1 * wo[None, :]
        else:
            z2 = _dot(a1, tl.trans(w2), PRECISION) + b2[None, :]
            a2, d2 = _activation(z2, ACT2, PARAM2, PTX_MATH)
            if N_HIDDEN == 2:
                e2 = d2 * wo[None, :]
            else:
                z3 = _dot(a2, tl.trans(w3), PRECISION) + b3[None, :]
                a3, d3 = _activation(z3, ACT3, PARAM3, PTX_MATH)
                e3 = d3 * wo[None, :]
                e2 = _dot(e3, w3, PRECISION) * d2
            e1 = _dot(e2, w2, PRECISION) * d1
        if CONTRASTIVE:
            if N_HIDDEN == 1:
                a2, e2, a3, e3 = a1, e1, a1, e1  # not read
            elif N_HIDDEN == 2:
                a3, e3 = a2, e2
            if (k == 0) | (k == n_steps):
                _contribute(
                    part_ptr,
                    e_ptr,
                    a_ptr,
                    b_ptr,
                    bo_ptr,
                    tl.minimum(k, 1),
                    pid,
                    n,
                    rows,
                    row_ok,
                    x,
                    a1,
                    e1,
                    a2,
                    e2,
                    a3,
                    e3,
                    wo,
                    D0,
                    H1,
                    H2,
                    H3,
                    N_HIDDEN,
                    HAS_B,
                    P,
                    PRECISION,
                )
            if k < n_steps:
                grad = _dot(e1, w1, PRECISION)
                x = _langevin_move(
                    x,
                    grad,
                    hs,
                    ss,
                    k,
                    offset,
                    noise_ptr,
                    n,
                    d,
                    rows,
                    rows64,
                    cols,
                    mask,
                    col_ok,
                    seed_lo,
                    seed_hi,
                    D0,
                    DN,
                    BLOCK_N,
                    NOISE_FROM_TENSOR,
                )
        else:
            grad = _dot(e1, w1, PRECISION)  # (BLOCK_N, D0); zero in the padded columns
            x = _langevin_move(
                x,
                grad,
                hs,
                ss,
                k,
                offset,
                noise_ptr,
                n,
                d,
                rows,
                rows64,
                cols,
                mask,
                col_ok,
                seed_lo,
                seed_hi,
                D0,
                DN,
                BLOCK_N,
                NOISE_FROM_TENSOR,
            )

    tl.store(out_ptr + rows64[:, None] * stride_out + cols[None, :], _stored(x, out_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["n", "d", "seed_lo", "seed_hi", "step_lo", "step_hi"])
def normals_kernel(out_ptr, n, d, seed_lo, seed_hi, step_lo, step_hi, D: tl.constexpr, BLOCK_N: tl.constexpr):
    """The stream's normals ``(n, d)`` at ``step`` (what the chain adds at that step)."""
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.arange(0, D)
    xi = _normals(seed_lo, seed_hi, rows, step_hi.to(tl.int64) * 2147483648 + step_lo.to(tl.int64), D, BLOCK_N)
    mask = (rows < n)[:, None] & (cols < d)[None, :]
    tl.store(out_ptr + rows.to(tl.int64)[:, None] * d + cols[None, :], xi, mask=mask)


COMPILED: bool = not isinstance(langevin_kernel, InterpretedFunction)
"""Whether the kernels run compiled: False under Triton's interpreter (``TRITON_INTERPRET=1`` when this module was
imported: ``@triton.jit`` reads it then), which runs them on CPU tensors."""


def _halves(seed: int, step: int) -> tuple[int, int, int, int]:
    """``(seed_lo, seed_hi, step_lo, step_hi)``: a 64-bit seed as 32-bit words, a step < 2⁶² as 31-bit ones."""
    if not 0 <= seed < 2**64 or not 0 <= step < 2**62:
        raise InputError(f"seed must be in [0, 2^64) and the steps in [0, 2^62); got seed {seed}, step {step}")
    lo, hi = seed & 0xFFFFFFFF, seed >> 32
    return (lo - 2**32 if lo >= 2**31 else lo), (hi - 2**32 if hi >= 2**31 else hi), step & 0x7FFFFFFF, step >> 31


def launch_langevin(
    x: Tensor,
    out: Tensor,
    tensors: Sequence[Tensor],
    padded: Sequence[int],
    acts: Sequence[int],
    n_steps: int,
    h: float,
    s: float,
    hv: Optional[Tensor],
    sv: Optional[Tensor],
    seed: int,
    offset: int,
    precision: str,
    block_n: int,
    num_warps: int,
    noise: Optional[Tensor],
    contrastive: Optional[tuple[Tensor, Optional[Tensor], Tensor, Tensor, Tensor]] = None,
) -> None:
    """Launch :func:`langevin_kernel` over ``cdiv(n, block_n)`` programs (arguments from ``triton_chains``);
    ``contrastive``: ``(a (2, n), b (2, n) or None, energies (2, n), partial sums (2·programs, P), output bias·sign (1,))``
    for the ``CONTRASTIVE`` variant."""
    n, d = x.shape
    n_hidden = len(acts)
    weights = list(tensors[:-1]) + [tensors[0]] * (6 - len(tensors[:-1]))  # unused layers: any pointer
    widths = list(padded[1:]) + [16] * (3 - n_hidden)
    kinds, params = zip(*(decode(code) for code in list(acts) + [0] * (3 - n_hidden)))
    placeholder = tensors[-1]
    a, b, energies, partials, bo = (
        contrastive if contrastive is not None else (placeholder, None, placeholder, placeholder, placeholder)
    )
    grid = (triton.cdiv(n, block_n),)
    langevin_kernel[grid](
        x,
        out,
        noise if noise is not None else placeholder,
        hv if hv is not None else placeholder,
        sv if sv is not None else placeholder,
        *weights,
        tensors[-1],
        a,
        b if b is not None else placeholder,
        bo,
        energies,
        partials,
        n,
        d,
        x.stride(0),
        out.stride(0),
        n_steps,
        h,
        s,
        *_halves(seed, offset),
        D0=padded[0],
        DN=noise_columns(d, padded[0], block_n),
        H1=widths[0],
        H2=widths[1],
        H3=widths[2],
        N_HIDDEN=n_hidden,
        ACT1=kinds[0],
        ACT2=kinds[1],
        ACT3=kinds[2],
        PARAM1=params[0],
        PARAM2=params[1],
        PARAM3=params[2],
        BLOCK_N=block_n,
        NOISE_FROM_TENSOR=noise is not None,
        PER_CHAIN_H=hv is not None,
        PER_CHAIN_S=sv is not None,
        PRECISION=precision,
        CONTRASTIVE=contrastive is not None,
        HAS_B=b is not None,
        P=partials.shape[1] if contrastive is not None else 1,
        PTX_MATH=COMPILED,
        num_warps=num_warps,
    )


def noise_columns(d: int, padded: int, block_n: int) -> int:
    """The columns whose normals the chain draws: with 64 chains per program or more, the first power of 2 at least
    ``d`` and 4 (one Philox block gives 4 normals), at most the state's ``padded`` columns; with fewer, all ``padded``
    (widening the narrow tile costs more than its Philox blocks save there). By the step loop's instructions
    (``benchmarks/triton_static.py``, sm_90, 2-64-64-1, before the activations' one-instruction exponentials): 64 chains
    on 4 warps, TF32 products, 125 → 111 per chain-step, bfloat16 ones 109 → 92; 16 on 4, IEEE, 538 → 546, and 32 on 4,
    TF32, the contrastive kernel, 204 → 205."""
    return min(padded, max(4, triton.next_power_of_2(d))) if block_n >= 64 else padded


def launch_normals(out: Tensor, seed: int, step: int) -> None:
    n, d = out.shape  # D: a power of 2 (tl.arange takes no other), the chain's padding of d
    normals_kernel[(triton.cdiv(n, 16),)](out, n, d, *_halves(seed, step), D=max(16, triton.next_power_of_2(d)), BLOCK_N=16)
