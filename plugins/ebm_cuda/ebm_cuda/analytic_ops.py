"""The analytic energies' ops: ``torch.ops.ebm_cuda.energy`` (energies and gradients), the fused ``langevin_chain``,
``hmc_chain`` and ``nuts_chain``, and the step kernels ``langevin_step`` and ``langevin_step_philox``.

Each runs the host build on CPU tensors and the CUDA build on CUDA tensors (on the current stream), and has a fake
implementation, so ``torch.compile`` traces through it: one row each of :mod:`ebm_cuda.native`. Energies are ``kind`` codes
(:data:`KINDS`, read from ``csrc/ebm/energies.h``) with parameters ``v0`` (a ``(d,)`` vector: mean or center), ``v1``
(a ``(d, d)`` matrix: precision) and scalars ``a``, ``b``, in the state's math dtype (float64 for float64 states, else
float32); :mod:`ebm_cuda.energies` maps an energy's declared parameters onto them. Random draws come from the Philox
stream of ``csrc/ebm/philox.h`` keyed by ``seed`` at steps ``offset, offset + 1, ...``; :mod:`ebm_cuda.reference`
reproduces it in PyTorch.
"""

from __future__ import annotations

import ctypes
from ctypes import c_double, c_int, c_int64, c_uint64, c_void_p
from typing import Optional

import torch
from torch import Tensor

from ebmcore.errors import InputError
from ebm_cuda.dispatch import _chain_run, _check, _check_stream, _cuda_build, _like, _ptr, _run, _vector, math_dtype
from ebm_cuda.energies import KINDS, LAYOUTS
from ebm_cuda.library import DTYPE_CODES, ENERGY, EnergySpec
from ebm_cuda.native import NativeOp, define

__all__ = [
    "KINDS",
    "MAX_CUDA_CHAIN_DIM",
    "energy",
    "langevin_chain",
    "hmc_chain",
    "nuts_chain",
    "langevin_step",
    "langevin_step_philox",
]

_LAYOUT_OF_CODE = {layout.code: layout for layout in LAYOUTS.values()}
MAX_CUDA_CHAIN_DIM = 64
"""The CUDA chain kernels keep a chain in registers or local memory: at most 64 elements."""


def _spec(x: Tensor, kind: int, v0: Optional[Tensor], v1: Optional[Tensor], a: float, b: float) -> tuple[EnergySpec, tuple]:
    """The C description of the energy, and the parameter tensors it points into (keep them alive).
    ``v0``/``v1`` must be given exactly where the energy's declared parameters put a tensor."""
    layout = _LAYOUT_OF_CODE.get(kind)
    if layout is None:
        raise InputError(f"ebm_cuda: unknown energy kind {kind}; known: {KINDS}.")
    uses = layout.tensors()
    missing = [f"{p.name} {p.shape_text} as {slot}" for slot, p in uses.items() if {"v0": v0, "v1": v1}[slot] is None]
    if missing:
        raise InputError(f"ebm_cuda: energy {layout.name} (kind {kind}) needs its parameter tensors: {', '.join(missing)}.")
    d = x.shape[1]
    md = math_dtype(x.dtype)
    keep = []
    for slot, t, shape in (("v0", v0, (d,)), ("v1", v1, (d, d))):
        if t is not None:
            if slot not in uses:
                raise InputError(f"ebm_cuda: energy {layout.name} (kind {kind}) takes no {slot}; pass None.")
            if t.shape != shape:
                raise InputError(
                    f"ebm_cuda: {layout.name}'s {uses[slot].name} ({slot}) of shape {tuple(t.shape)} does not fit "
                    f"dim {d}: expected {uses[slot].shape_text} = {shape}."
                )
            t = t.to(device=x.device, dtype=md).contiguous()
        keep.append(t)
    spec = EnergySpec(kind, d, _ptr(keep[0]), _ptr(keep[1]), float(a), float(b))
    return spec, tuple(keep)


def _check_chain_dim(x: Tensor, what: str) -> None:
    if x.device.type == "cuda" and x.shape[1] > MAX_CUDA_CHAIN_DIM:
        raise InputError(
            f"ebm_cuda.{what}: the CUDA chain kernels take at most {MAX_CUDA_CHAIN_DIM} elements per chain, "
            f"got {x.shape[1]}; use the samplers' per-step loop (fused=False) or the torch backend."
        )


def _energy(x: Tensor, kind: int, v0: Optional[Tensor], v1: Optional[Tensor], a: float, b: float, gradient: bool) -> Tensor:
    """``E(x): (n,)``, or with ``gradient`` ``∇E(x): (n, d)``, of the energy ``kind``; ``x: (n, d)``."""
    x = _check(x, "energy")
    out = x.new_empty(x.shape if gradient else x.shape[:1])
    spec, _keep = _spec(x, kind, v0, v1, a, b)
    _run(
        x.device,
        "energy",
        ctypes.byref(spec),
        DTYPE_CODES[x.dtype],
        x.data_ptr(),
        x.shape[0],
        None if gradient else out.data_ptr(),
        out.data_ptr() if gradient else None,
    )
    return out


def _energy_fake(x, kind, v0, v1, a, b, gradient):
    return x.new_empty(x.shape if gradient else x.shape[:1])


energy = define(
    NativeOp("energy", _energy, _energy_fake, symbol="energy", argtypes=(ENERGY, c_int, c_void_p, c_int64, c_void_p, c_void_p))
)


def _langevin_chain(
    x: Tensor,
    kind: int,
    v0: Optional[Tensor],
    v1: Optional[Tensor],
    a: float,
    b: float,
    n_steps: int,
    step_size: float,
    noise_scale: float,
    step_sizes: Optional[Tensor],
    noise_scales: Optional[Tensor],
    seed: int,
    offset: int,
) -> Tensor:
    """``n_steps`` Langevin steps ``x − h∇E(x) + s·ξ`` in one launch; ``step_sizes``/``noise_scales``
    ``(n,)`` (per chain) replace the scalars when given. Returns the new ``x: (n, d)``."""
    x = _check(x, "langevin_chain")
    _check_chain_dim(x, "langevin_chain")
    hv, sv = _chain_run("langevin_chain", x, n_steps, 0, step_sizes, noise_scales, seed, offset)
    if n_steps == 0:
        return x.clone()
    out = torch.empty_like(x)
    spec, _keep = _spec(x, kind, v0, v1, a, b)
    _run(
        x.device,
        "langevin_chain",
        ctypes.byref(spec),
        DTYPE_CODES[x.dtype],
        x.data_ptr(),
        out.data_ptr(),
        x.shape[0],
        n_steps,
        step_size,
        noise_scale,
        _ptr(hv),
        _ptr(sv),
        seed,
        offset,
    )
    return out


def _langevin_chain_fake(x, kind, v0, v1, a, b, n_steps, step_size, noise_scale, step_sizes, noise_scales, seed, offset):
    return torch.empty_like(x)


langevin_chain = define(
    NativeOp(
        "langevin_chain",
        _langevin_chain,
        _langevin_chain_fake,
        symbol="langevin_chain",
        argtypes=(
            ENERGY,
            c_int,
            c_void_p,
            c_void_p,
            c_int64,
            c_int64,
            c_double,
            c_double,
            c_void_p,
            c_void_p,
            c_uint64,
            c_uint64,
        ),
    )
)


def _hmc_chain(
    x: Tensor,
    kind: int,
    v0: Optional[Tensor],
    v1: Optional[Tensor],
    a: float,
    b: float,
    n_steps: int,
    step_size: float,
    step_sizes: Optional[Tensor],
    n_leapfrog_steps: int,
    inverse_temperature: float,
    seed: int,
    offset: int,
) -> tuple[Tensor, Tensor, Tensor]:
    """``n_steps`` HMC transitions (identity mass, leapfrog) in one launch.
    Returns ``x': (n, d)``, accepted and divergent counts ``(n,)`` (int32)."""
    x = _check(x, "hmc_chain")
    _check_chain_dim(x, "hmc_chain")
    _check_stream(seed, offset)
    if n_leapfrog_steps < 1 or n_steps < 0:
        raise InputError(
            f"ebm_cuda.hmc_chain: n_leapfrog_steps must be >= 1 and n_steps >= 0, got {n_leapfrog_steps} and {n_steps}."
        )
    accepted = torch.zeros(x.shape[0], dtype=torch.int32, device=x.device)
    divergent = torch.zeros_like(accepted)
    if n_steps == 0:
        return x.clone(), accepted, divergent
    out = torch.empty_like(x)
    spec, _keep = _spec(x, kind, v0, v1, a, b)
    hv = _vector(step_sizes, x, "step_sizes")
    _run(
        x.device,
        "hmc_chain",
        ctypes.byref(spec),
        DTYPE_CODES[x.dtype],
        x.data_ptr(),
        out.data_ptr(),
        x.shape[0],
        n_steps,
        step_size,
        _ptr(hv),
        n_leapfrog_steps,
        inverse_temperature,
        seed,
        offset,
        accepted.data_ptr(),
        divergent.data_ptr(),
    )
    return out, accepted, divergent


def _hmc_chain_fake(x, kind, v0, v1, a, b, n_steps, step_size, step_sizes, n_leapfrog_steps, inverse_temperature, seed, offset):
    counts = x.new_empty(x.shape[:1], dtype=torch.int32)
    return torch.empty_like(x), counts, torch.empty_like(counts)


_HAMILTONIAN_HEAD = (ENERGY, c_int, c_void_p, c_void_p, c_int64, c_int64, c_double, c_void_p, c_int, c_double, c_uint64, c_uint64)
"""The arguments the HMC and NUTS chains start with: ``spec, dtype, x, out, n, n_steps, h, h_vec``, the leapfrog
count (HMC) or the tree depth (NUTS), ``beta, seed, offset``."""

hmc_chain = define(
    NativeOp(
        "hmc_chain",
        _hmc_chain,
        _hmc_chain_fake,
        symbol="hmc_chain",
        argtypes=(
            *_HAMILTONIAN_HEAD,
            c_void_p,
            c_void_p,
        ),
    )
)


def _nuts_chain(
    x: Tensor,
    kind: int,
    v0: Optional[Tensor],
    v1: Optional[Tensor],
    a: float,
    b: float,
    n_steps: int,
    step_size: float,
    step_sizes: Optional[Tensor],
    max_tree_depth: int,
    inverse_temperature: float,
    seed: int,
    offset: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """``n_steps`` NUTS iterations (multinomial, identity mass, trees of at most ``2^max_tree_depth − 1`` leapfrog
    steps) in one launch, each chain on its own. Returns ``x': (n, d)`` and per chain ``(n,)`` sums over the
    iterations: the acceptance statistic (math dtype), divergent iterations (int32), leapfrog steps and tree
    depths (int64)."""
    x = _check(x, "nuts_chain")
    _check_chain_dim(x, "nuts_chain")
    _check_stream(seed, offset)
    if not 1 <= max_tree_depth <= 20 or n_steps < 0:
        raise InputError(
            f"ebm_cuda.nuts_chain: max_tree_depth must be in [1, 20] and n_steps >= 0, got {max_tree_depth} and {n_steps}."
        )
    n = x.shape[0]
    acceptance = torch.zeros(n, dtype=math_dtype(x.dtype), device=x.device)
    divergent = torch.zeros(n, dtype=torch.int32, device=x.device)
    n_leapfrog = torch.zeros(n, dtype=torch.int64, device=x.device)
    tree_depth = torch.zeros_like(n_leapfrog)
    if n_steps == 0:
        return x.clone(), acceptance, divergent, n_leapfrog, tree_depth
    out = torch.empty_like(x)
    spec, _keep = _spec(x, kind, v0, v1, a, b)
    hv = _vector(step_sizes, x, "step_sizes")
    # the CUDA build keeps each chain's tree checkpoints here (the host build uses per-thread scratch)
    workspace = (
        torch.empty(n * 2 * max(max_tree_depth - 1, 1) * x.shape[1], dtype=torch.float32, device=x.device)
        if _cuda_build(x.device)
        else None
    )
    _run(
        x.device,
        "nuts_chain",
        ctypes.byref(spec),
        DTYPE_CODES[x.dtype],
        x.data_ptr(),
        out.data_ptr(),
        n,
        n_steps,
        step_size,
        _ptr(hv),
        max_tree_depth,
        inverse_temperature,
        seed,
        offset,
        acceptance.data_ptr(),
        divergent.data_ptr(),
        n_leapfrog.data_ptr(),
        tree_depth.data_ptr(),
        _ptr(workspace),
    )
    return out, acceptance, divergent, n_leapfrog, tree_depth


def _nuts_chain_fake(x, kind, v0, v1, a, b, n_steps, step_size, step_sizes, max_tree_depth, inverse_temperature, seed, offset):
    n = x.shape[0]
    steps = x.new_empty((n,), dtype=torch.int64)
    return (
        torch.empty_like(x),
        x.new_empty((n,), dtype=math_dtype(x.dtype)),
        x.new_empty((n,), dtype=torch.int32),
        steps,
        torch.empty_like(steps),
    )


nuts_chain = define(
    NativeOp(
        "nuts_chain",
        _nuts_chain,
        _nuts_chain_fake,
        symbol="nuts_chain",
        argtypes=(
            *_HAMILTONIAN_HEAD,
            *(c_void_p,) * 5,
        ),
    )
)


def _langevin_step_philox(
    x: Tensor,
    grad: Tensor,
    step_size: float,
    noise_scale: float,
    step_sizes: Optional[Tensor],
    noise_scales: Optional[Tensor],
    seed: int,
    offset: int,
) -> Tensor:
    """One Langevin step ``x − h·grad + s·ξ`` with ``ξ`` drawn in the kernel (step ``offset`` of the stream)."""
    x = _check(x, "langevin_step_philox")
    _check_stream(seed, offset)
    grad = _like(grad, x, "grad")
    out = torch.empty_like(x)
    hv, sv = _vector(step_sizes, x, "step_sizes"), _vector(noise_scales, x, "noise_scales")
    _run(
        x.device,
        "langevin_update",
        DTYPE_CODES[x.dtype],
        x.data_ptr(),
        grad.data_ptr(),
        out.data_ptr(),
        x.shape[0],
        x.shape[1],
        step_size,
        noise_scale,
        _ptr(hv),
        _ptr(sv),
        seed,
        offset,
    )
    return out


def _langevin_step_philox_fake(x, grad, step_size, noise_scale, step_sizes, noise_scales, seed, offset):
    return torch.empty_like(x)


langevin_step_philox = define(
    NativeOp(
        "langevin_step_philox",
        _langevin_step_philox,
        _langevin_step_philox_fake,
        symbol="langevin_update",
        argtypes=(
            c_int,
            c_void_p,
            c_void_p,
            c_void_p,
            c_int64,
            c_int,
            c_double,
            c_double,
            c_void_p,
            c_void_p,
            c_uint64,
            c_uint64,
        ),
    )
)


def _langevin_step(
    x: Tensor,
    grad: Tensor,
    noise: Tensor,
    step_size: float,
    noise_scale: float,
    step_sizes: Optional[Tensor],
    noise_scales: Optional[Tensor],
) -> Tensor:
    """``x − h·grad + s·noise`` in one pass (the core's ``langevin_step`` op)."""
    x = _check(x, "langevin_step")
    grad, noise = _like(grad, x, "grad"), _like(noise, x, "noise")
    out = torch.empty_like(x)
    hv, sv = _vector(step_sizes, x, "step_sizes"), _vector(noise_scales, x, "noise_scales")
    _run(
        x.device,
        "langevin_step",
        DTYPE_CODES[x.dtype],
        out.data_ptr(),
        x.data_ptr(),
        grad.data_ptr(),
        noise.data_ptr(),
        x.shape[0],
        x.shape[1],
        step_size,
        noise_scale,
        _ptr(hv),
        _ptr(sv),
    )
    return out


def _langevin_step_fake(x, grad, noise, step_size, noise_scale, step_sizes, noise_scales):
    return torch.empty_like(x)


langevin_step = define(
    NativeOp(
        "langevin_step",
        _langevin_step,
        _langevin_step_fake,
        symbol="langevin_step",
        argtypes=(c_int, *(c_void_p,) * 4, c_int64, c_int, c_double, c_double, c_void_p, c_void_p),
    )
)
