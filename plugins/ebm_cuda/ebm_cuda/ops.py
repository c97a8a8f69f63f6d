"""The kernels as PyTorch ops, registered with ``torch.library`` as ``torch.ops.ebm_cuda.*``.

Each op runs the host build on CPU tensors and the CUDA build on CUDA tensors (on the current
stream), and has a fake implementation, so ``torch.compile`` traces through it. The Triton kernels'
two ops (``triton_langevin_chain``, ``triton_contrastive_chain``, in :mod:`ebm_cuda.triton_chains`) are
defined with the same :func:`_op` but run CUDA tensors only, and CPU tensors under Triton's interpreter. Energies are
``kind`` codes (:data:`KINDS`, read from ``csrc/ebm/energies.h``) with parameters ``v0`` (a ``(d,)``
vector: mean or center), ``v1`` (a ``(d, d)`` matrix: precision) and scalars ``a``, ``b``, in the
state's math dtype (float64 for float64 states, else float32); :mod:`ebm_cuda.energies` maps an
energy's declared parameters onto them.
Random draws come from the Philox stream of ``csrc/ebm/philox.h`` keyed by ``seed`` at steps
``offset, offset + 1, ...``; :mod:`ebm_cuda.reference` reproduces it in PyTorch.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from contextvars import ContextVar
from typing import Iterator, Optional, Sequence

import torch
from torch import Tensor

from ebmcore.errors import InputError
from ebm_cuda import library
from ebm_cuda.energies import KINDS, LAYOUTS
from ebm_cuda.library import DTYPE_CODES, EnergySpec

__all__ = ["KINDS", "MAX_CUDA_CHAIN_DIM", "call", "cuda_emulation", "feedforward_denoising_score_matching", "feedforward_sliced_score_matching", "feedforward_energy_gradients", "feedforward_contrastive_chain", "math_dtype", "normal", "philox4x32", "uniform"]

_LAYOUT_OF_CODE = {layout.code: layout for layout in LAYOUTS.values()}
MAX_CUDA_CHAIN_DIM = 64
"""The CUDA chain kernels keep a chain in registers or local memory: at most 64 elements."""

_CUDA_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_LIBRARY = torch.library.Library("ebm_cuda", "DEF")
_OPS: dict[str, torch._ops.OpOverload] = {}


def _op(name: str, impl, mutates_args: tuple[str, ...] = ()) -> torch._ops.OpOverload:
    """Define ``torch.ops.ebm_cuda.<name>`` once: its schema inferred from ``impl``'s annotations (``mutates_args``: the
    arguments it writes into), ``impl`` its CPU and CUDA kernel (the host build or the CUDA build, by the inputs'
    device; the Triton kernels, :mod:`ebm_cuda.triton_chains`, on CUDA and under Triton's interpreter). Defined with the low-level
    ``torch.library.Library``, a call through :func:`call` costs about 8 µs more than the implementation called
    directly, where ``torch.library.custom_op``'s wrapper costs about 17 µs (why eager calls used to bypass the op;
    ``benchmarks/op_dispatch.py``); every call, eager or traced, goes through it."""
    _LIBRARY.define(name + torch.library.infer_schema(impl, mutates_args=mutates_args))
    for key in ("CPU", "CUDA"):
        _LIBRARY.impl(name, impl, key)
    _OPS[name] = getattr(torch.ops.ebm_cuda, name).default
    return _OPS[name]
_SYNC = os.environ.get("EBM_CUDA_SYNC", "") not in ("", "0")
_SEED_LIMIT = 2**63


def math_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the kernels compute in for states of ``dtype``."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _check(x: Tensor, what: str) -> Tensor:
    if x.dim() != 2:
        raise InputError(f"ebm_cuda.{what}: x must be (n_chains, dim), got shape {tuple(x.shape)}.")
    if x.dtype not in DTYPE_CODES or (x.device.type == "cuda" and x.dtype not in _CUDA_DTYPES):
        raise InputError(f"ebm_cuda.{what}: dtype {x.dtype} is not supported on {x.device.type}; "
                         "use float32, bfloat16 or float16 (float64 on CPU), or the torch backend.")
    if x.device.type not in ("cpu", "cuda"):
        raise InputError(f"ebm_cuda.{what}: tensors on {x.device} are not supported (cpu or cuda).")
    if x.shape[0] >= 2**32:
        raise InputError(f"ebm_cuda.{what}: at most 2**32 - 1 chains per call, got {x.shape[0]}.")
    return x.contiguous()


_EMULATED: ContextVar[Optional[library.Library]] = ContextVar("ebm_cuda_emulated", default=None)


@contextlib.contextmanager
def cuda_emulation(lib: library.Library) -> Iterator[None]:
    """Inside, the ops run CPU tensors on ``lib``, ``kernels.cu`` built for the host (``build.build_cuda_emulated()``,
    loaded as ``Library(path, "cuda")``), as they run CUDA tensors on the CUDA build (its workspaces, no stream: its
    launches return when done), instead of on the host build: how the tests run the ``.cu`` file without a GPU."""
    token = _EMULATED.set(lib)
    try:
        yield
    finally:
        _EMULATED.reset(token)


def _cuda_build(device: torch.device) -> bool:
    """Whether ``device``'s tensors run on a build of ``kernels.cu`` (a GPU's, or the host emulation's)."""
    return device.type == "cuda" or _EMULATED.get() is not None


def _run(device: torch.device, name: str, *args) -> None:
    if device.type == "cuda":
        with torch.cuda.device(device):
            library.cuda(device).call(name, *args, ctypes.c_void_p(torch.cuda.current_stream(device).cuda_stream))
            if _SYNC:  # EBM_CUDA_SYNC=1: surface asynchronous kernel errors at the call that caused them
                torch.cuda.synchronize(device)
    elif _EMULATED.get() is not None:
        _EMULATED.get().call(name, *args, None)
    else:
        library.host().call(name, *args, torch.get_num_threads())


def _like(t: Tensor, x: Tensor, name: str) -> Tensor:
    """``t`` with ``x``'s shape checked, on ``x``'s device and dtype, contiguous."""
    if t.shape != x.shape:
        raise InputError(f"ebm_cuda: {name} must have the shape of x, {tuple(x.shape)}, got {tuple(t.shape)}.")
    return t.to(device=x.device, dtype=x.dtype).contiguous()


def _vector(v: Optional[Tensor], x: Tensor, name: str) -> Optional[Tensor]:
    if v is None:
        return None
    if v.shape != (x.shape[0],):
        raise InputError(f"ebm_cuda: {name} must have shape (n_chains,) = ({x.shape[0]},), got {tuple(v.shape)}.")
    return v.to(device=x.device, dtype=math_dtype(x.dtype)).contiguous()


def _ptr(t: Optional[Tensor]) -> Optional[int]:
    return None if t is None else t.data_ptr()


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
                raise InputError(f"ebm_cuda: {layout.name}'s {uses[slot].name} ({slot}) of shape {tuple(t.shape)} does not fit "
                                 f"dim {d}: expected {uses[slot].shape_text} = {shape}.")
            t = t.to(device=x.device, dtype=md).contiguous()
        keep.append(t)
    spec = EnergySpec(kind, d, _ptr(keep[0]), _ptr(keep[1]), float(a), float(b))
    return spec, tuple(keep)


def _check_stream(seed: int, offset: int) -> None:
    if not (0 <= seed < _SEED_LIMIT and 0 <= offset < _SEED_LIMIT):
        raise InputError(f"ebm_cuda: seed and offset must be in [0, 2**63), got {seed} and {offset}.")


def _chain_run(what: str, x: Tensor, n_steps: int, min_steps: int, step_sizes: Optional[Tensor], noise_scales: Optional[Tensor],
               seed: int, offset: int) -> tuple[Optional[Tensor], Optional[Tensor]]:
    """The checks every chain op makes of its run (``n_steps >= min_steps``, the stream position), and its per-chain
    step sizes and noise scales for states ``x`` (None: the scalars)."""
    _check_stream(seed, offset)
    if n_steps < min_steps:
        raise InputError(f"ebm_cuda.{what}: n_steps must be >= {min_steps}, got {n_steps}.")
    return _vector(step_sizes, x, "step_sizes"), _vector(noise_scales, x, "noise_scales")


def _check_chain_dim(x: Tensor, what: str) -> None:
    if x.device.type == "cuda" and x.shape[1] > MAX_CUDA_CHAIN_DIM:
        raise InputError(f"ebm_cuda.{what}: the CUDA chain kernels take at most {MAX_CUDA_CHAIN_DIM} elements per chain, "
                         f"got {x.shape[1]}; use the samplers' per-step loop (fused=False) or the torch backend.")


def _energy(x: Tensor, kind: int, v0: Optional[Tensor], v1: Optional[Tensor], a: float, b: float, gradient: bool) -> Tensor:
    """``E(x): (n,)``, or with ``gradient`` ``∇E(x): (n, d)``, of the energy ``kind``; ``x: (n, d)``."""
    x = _check(x, "energy")
    out = x.new_empty(x.shape if gradient else x.shape[:1])
    spec, _keep = _spec(x, kind, v0, v1, a, b)
    _run(x.device, "energy", ctypes.byref(spec), DTYPE_CODES[x.dtype], x.data_ptr(), x.shape[0],
         None if gradient else out.data_ptr(), out.data_ptr() if gradient else None)
    return out


energy = _op("energy", _energy)


@torch.library.register_fake("ebm_cuda::energy")
def _(x, kind, v0, v1, a, b, gradient):
    return x.new_empty(x.shape if gradient else x.shape[:1])


def _langevin_chain(x: Tensor, kind: int, v0: Optional[Tensor], v1: Optional[Tensor], a: float, b: float, n_steps: int,
                   step_size: float, noise_scale: float, step_sizes: Optional[Tensor], noise_scales: Optional[Tensor],
                   seed: int, offset: int) -> Tensor:
    """``n_steps`` Langevin steps ``x − h∇E(x) + s·ξ`` in one launch; ``step_sizes``/``noise_scales``
    ``(n,)`` (per chain) replace the scalars when given. Returns the new ``x: (n, d)``."""
    x = _check(x, "langevin_chain")
    _check_chain_dim(x, "langevin_chain")
    hv, sv = _chain_run("langevin_chain", x, n_steps, 0, step_sizes, noise_scales, seed, offset)
    if n_steps == 0:
        return x.clone()
    out = torch.empty_like(x)
    spec, _keep = _spec(x, kind, v0, v1, a, b)
    _run(x.device, "langevin_chain", ctypes.byref(spec), DTYPE_CODES[x.dtype], x.data_ptr(), out.data_ptr(), x.shape[0], n_steps,
         step_size, noise_scale, _ptr(hv), _ptr(sv), seed, offset)
    return out


langevin_chain = _op("langevin_chain", _langevin_chain)


@torch.library.register_fake("ebm_cuda::langevin_chain")
def _(x, kind, v0, v1, a, b, n_steps, step_size, noise_scale, step_sizes, noise_scales, seed, offset):
    return torch.empty_like(x)


def _hmc_chain(x: Tensor, kind: int, v0: Optional[Tensor], v1: Optional[Tensor], a: float, b: float, n_steps: int,
              step_size: float, step_sizes: Optional[Tensor], n_leapfrog_steps: int, inverse_temperature: float,
              seed: int, offset: int) -> tuple[Tensor, Tensor, Tensor]:
    """``n_steps`` HMC transitions (identity mass, leapfrog) in one launch.
    Returns ``x': (n, d)``, accepted and divergent counts ``(n,)`` (int32)."""
    x = _check(x, "hmc_chain")
    _check_chain_dim(x, "hmc_chain")
    _check_stream(seed, offset)
    if n_leapfrog_steps < 1 or n_steps < 0:
        raise InputError(f"ebm_cuda.hmc_chain: n_leapfrog_steps must be >= 1 and n_steps >= 0, got {n_leapfrog_steps} and {n_steps}.")
    accepted = torch.zeros(x.shape[0], dtype=torch.int32, device=x.device)
    divergent = torch.zeros_like(accepted)
    if n_steps == 0:
        return x.clone(), accepted, divergent
    out = torch.empty_like(x)
    spec, _keep = _spec(x, kind, v0, v1, a, b)
    hv = _vector(step_sizes, x, "step_sizes")
    _run(x.device, "hmc_chain", ctypes.byref(spec), DTYPE_CODES[x.dtype], x.data_ptr(), out.data_ptr(), x.shape[0], n_steps, step_size,
         _ptr(hv), n_leapfrog_steps, inverse_temperature, seed, offset, accepted.data_ptr(), divergent.data_ptr())
    return out, accepted, divergent


hmc_chain = _op("hmc_chain", _hmc_chain)


@torch.library.register_fake("ebm_cuda::hmc_chain")
def _(x, kind, v0, v1, a, b, n_steps, step_size, step_sizes, n_leapfrog_steps, inverse_temperature, seed, offset):
    counts = x.new_empty(x.shape[:1], dtype=torch.int32)
    return torch.empty_like(x), counts, torch.empty_like(counts)


def _nuts_chain(x: Tensor, kind: int, v0: Optional[Tensor], v1: Optional[Tensor], a: float, b: float, n_steps: int,
               step_size: float, step_sizes: Optional[Tensor], max_tree_depth: int, inverse_temperature: float,
               seed: int, offset: int) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """``n_steps`` NUTS iterations (multinomial, identity mass, trees of at most ``2^max_tree_depth − 1`` leapfrog
    steps) in one launch, each chain on its own. Returns ``x': (n, d)`` and per chain ``(n,)`` sums over the
    iterations: the acceptance statistic (math dtype), divergent iterations (int32), leapfrog steps and tree
    depths (int64)."""
    x = _check(x, "nuts_chain")
    _check_chain_dim(x, "nuts_chain")
    _check_stream(seed, offset)
    if not 1 <= max_tree_depth <= 20 or n_steps < 0:
        raise InputError(f"ebm_cuda.nuts_chain: max_tree_depth must be in [1, 20] and n_steps >= 0, got {max_tree_depth} and {n_steps}.")
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
    workspace = (torch.empty(n * 2 * max(max_tree_depth - 1, 1) * x.shape[1], dtype=torch.float32, device=x.device)
                 if _cuda_build(x.device) else None)
    _run(x.device, "nuts_chain", ctypes.byref(spec), DTYPE_CODES[x.dtype], x.data_ptr(), out.data_ptr(), n, n_steps, step_size,
         _ptr(hv), max_tree_depth, inverse_temperature, seed, offset, acceptance.data_ptr(), divergent.data_ptr(),
         n_leapfrog.data_ptr(), tree_depth.data_ptr(), _ptr(workspace))
    return out, acceptance, divergent, n_leapfrog, tree_depth


nuts_chain = _op("nuts_chain", _nuts_chain)


@torch.library.register_fake("ebm_cuda::nuts_chain")
def _(x, kind, v0, v1, a, b, n_steps, step_size, step_sizes, max_tree_depth, inverse_temperature, seed, offset):
    n = x.shape[0]
    steps = x.new_empty((n,), dtype=torch.int64)
    return (torch.empty_like(x), x.new_empty((n,), dtype=math_dtype(x.dtype)), x.new_empty((n,), dtype=torch.int32), steps,
            torch.empty_like(steps))


def _feedforward_langevin_chain(x: Tensor, weights: Sequence[Tensor], biases: Sequence[Optional[Tensor]], activations: Sequence[int],
                                sign: float, n_steps: int, step_size: float, noise_scale: float, step_sizes: Optional[Tensor],
                                noise_scales: Optional[Tensor], seed: int, offset: int) -> Tensor:
    """``n_steps`` Langevin steps of ``E(x) = sign · (W_L f(… f(W_1 x + b_1) …) + b_L)`` in one launch (host build,
    float32). ``weights[l]: (out_l, in_l)`` with ``in_0 = d`` and ``out_L = 1``; ``biases[l]: (out_l,)`` or None;
    ``activations``: one code of :data:`ebm_cuda.activations.ACTIVATION_CODES` per hidden layer. The noise is the stream's, as in
    ``langevin_chain``. Returns the new ``x: (n, d)``."""
    x, hv, sv = _chain_input(x, "feedforward_langevin_chain", weights, biases, activations, n_steps, 0, step_sizes, noise_scales,
                             seed, offset)
    if n_steps == 0:
        return x.clone()
    network, _keep = _network(weights, biases, activations)
    out = torch.empty_like(x)
    library.host().call("feedforward_langevin_chain", *network, float(sign), x.data_ptr(), out.data_ptr(), x.shape[0], n_steps,
                        step_size, noise_scale, _ptr(hv), _ptr(sv), seed, offset, torch.get_num_threads())
    return out


def _network_shapes(what: str, x: Tensor, weights: Sequence[Tensor], biases: Sequence[Optional[Tensor]],
                    activations: Sequence[int]) -> None:
    """Check that the layers chain from ``x: (n, d)`` to one output."""
    n_hidden = len(weights) - 1
    if n_hidden < 1 or len(biases) != len(weights) or len(activations) != n_hidden:
        raise InputError(f"ebm_cuda.{what}: give at least two layers, one bias (or None) per layer and one "
                         f"activation per hidden layer; got {len(weights)} weights, {len(biases)} biases, {len(activations)} activations.")
    width = x.shape[1]
    for l, w in enumerate(weights):
        if w.dim() != 2 or w.shape[1] != width or (l == n_hidden and w.shape[0] != 1):
            raise InputError(f"ebm_cuda.{what}: weights[{l}] of shape {tuple(w.shape)} does not follow width "
                             f"{width}" + (" into one output" if l == n_hidden else "") + ".")
        if biases[l] is not None and biases[l].shape != (w.shape[0],):
            raise InputError(f"ebm_cuda.{what}: biases[{l}] of shape {tuple(biases[l].shape)} does not fit weights[{l}] "
                             f"{tuple(w.shape)}.")
        width = w.shape[0]


def _float32(t: Tensor) -> Tensor:
    """``t`` as a contiguous float32 tensor the kernels read (itself when it is one already: no copy)."""
    return t if t.dtype == torch.float32 and t.is_contiguous() else t.detach().to(torch.float32).contiguous()


def _network(weights: Sequence[Tensor], biases: Sequence[Optional[Tensor]], activations: Sequence[int]) -> tuple[tuple, list]:
    """The C description ``(n_hidden, widths, weight pointers, bias pointers, activation codes)`` of checked layers,
    and the float32 tensors it points into (keep them alive)."""
    keep = [_float32(w) for w in weights]
    bias_tensors = [None if b is None else _float32(b) for b in biases]
    widths = [keep[0].shape[1], *(w.shape[0] for w in keep)]
    described = (len(weights) - 1, (ctypes.c_int64 * len(widths))(*widths),
                 (ctypes.c_void_p * len(keep))(*(t.data_ptr() for t in keep)),
                 (ctypes.c_void_p * len(bias_tensors))(*(None if b is None else b.data_ptr() for b in bias_tensors)),
                 (ctypes.c_int * len(activations))(*activations))
    return described, keep + [b for b in bias_tensors if b is not None]


def _feedforward_denoising_score_matching_host(x: Tensor, target: Tensor, scale: Optional[Tensor], weights: Sequence[Tensor],
                                         biases: Sequence[Optional[Tensor]], activations: Sequence[int],
                                         sign: float) -> tuple[Tensor, list[Optional[Tensor]], list[Optional[Tensor]]]:
    """``L = (1/2n) Σᵣ |aᵣ∇E(xᵣ) − bᵣ|²`` for the feed-forward energy of ``feedforward_langevin_chain`` (host build,
    float32), with its gradient in every weight and bias, in one pass over tiles of the batch. ``x``, ``target``
    (``b``): ``(n, d)``; ``scale`` (``a``): ``(n,)`` or None for ones. Returns ``(L: (), weight grads, bias grads)``
    (None where a layer has no bias, and for the output bias, which does not move ``∇E``, as autograd leaves it).
    Not an autograd op: the caller attaches the gradients."""
    x = _network_input(x, "feedforward_denoising_score_matching", weights, biases, activations)
    target = _like(target, x, "target")
    scale = None if scale is None else _vector(scale, x, "scale")
    return _network_loss("feedforward_dsm", weights, biases, activations, sign, x.data_ptr(), target.data_ptr(), _ptr(scale),
                         x.shape[0])


def _feedforward_sliced_score_matching_host(x: Tensor, v: Tensor, weights: Sequence[Tensor], biases: Sequence[Optional[Tensor]],
                                      activations: Sequence[int], sign: float) -> tuple[Tensor, list[Tensor], list[Optional[Tensor]]]:
    """``L = (1/n) Σᵣ ½(vᵣᵀ∇E(xᵣ))² − vᵣᵀ∇²E(xᵣ)vᵣ`` (sliced score matching, one direction ``vᵣ`` per row) for the
    feed-forward energy of ``feedforward_langevin_chain`` (host build, float32), with its gradient in every weight
    and bias, in one pass: the derivatives along ``v`` carried forwards, then reverse mode through them (no
    Hessian is formed). ``x``, ``v``: ``(n, d)``. Returns what ``feedforward_denoising_score_matching`` does."""
    x = _network_input(x, "feedforward_sliced_score_matching", weights, biases, activations)
    v = _like(v, x, "v")
    return _network_loss("feedforward_ssm", weights, biases, activations, sign, x.data_ptr(), v.data_ptr(), x.shape[0])


def _feedforward_energy_gradients_host(x: Tensor, a: Tensor, b: Optional[Tensor], weights: Sequence[Tensor],
                                 biases: Sequence[Optional[Tensor]], activations: Sequence[int],
                                 sign: float) -> tuple[Tensor, list[Tensor], list[Optional[Tensor]]]:
    """``E(x): (n,)`` of the feed-forward energy of ``feedforward_langevin_chain`` (host build, float32) and
    ``Σᵣ cᵣ ∂E(xᵣ)/∂θ`` for every weight and bias ``θ``, with ``cᵣ = aᵣ + bᵣ E(xᵣ)`` (``b`` None: zero), in one pass:
    the gradient of a loss linear or quadratic in the energies, ``c = ∂loss/∂E``. ``x: (n, d)``, ``a``, ``b``: ``(n,)``.
    Returns ``(E, weight grads, bias grads)`` (None where a layer has no bias)."""
    x = _network_input(x, "feedforward_energy_gradients", weights, biases, activations)
    a, b = _vector(a, x, "a"), _vector(b, x, "b")
    network, _keep = _network(weights, biases, activations)
    energies = x.new_empty(x.shape[0])
    grad_w, grad_b, pointers = _weight_gradients(weights, biases)
    out_bias = None if biases[-1] is None else torch.empty(1)
    library.host().call("feedforward_energy_gradient", *network, float(sign), x.data_ptr(), a.data_ptr(), _ptr(b), x.shape[0],
                        energies.data_ptr(), _ptr(out_bias), *pointers, torch.get_num_threads())
    return energies, grad_w, [*grad_b, out_bias]


def _feedforward_contrastive_chain_host(x: Tensor, start: tuple[Tensor, Optional[Tensor]], end: tuple[Tensor, Optional[Tensor]],
                                  weights: Sequence[Tensor], biases: Sequence[Optional[Tensor]], activations: Sequence[int],
                                  sign: float, n_steps: int, step_size: float, noise_scale: float, step_sizes: Optional[Tensor],
                                  noise_scales: Optional[Tensor], seed: int,
                                  offset: int) -> tuple[Tensor, Tensor, Tensor, Tensor, list[Tensor], list[Optional[Tensor]]]:
    """Contrastive divergence's chains, loss and weight gradient in one launch (host build, float32): the ``n_steps >= 1``
    moves of :func:`feedforward_langevin_chain` from ``x: (n, d)`` (the same states, to the bit), and, as
    :func:`feedforward_energy_gradients` computes them, the energies at the starts and the ends, the loss
    ``L = Σᵣ aᵣEᵣ + ½bᵣEᵣ²`` over both (in float64, returned as float32) and its gradient ``Σᵣ cᵣ ∂E(xᵣ)/∂θ``,
    ``c = a + b·E``, for ``start = (a, b)`` at the starts and ``end = (a, b)`` at the ends (``(n,)`` each, ``b`` None:
    zero). The first move reuses the starts' pass: one gradient fewer than a chain and a separate pass. Returns
    ``(x_end, E(x), E(x_end), L: (), weight grads, bias grads)``."""
    x, hv, sv = _chain_input(x, "feedforward_contrastive_chain", weights, biases, activations, n_steps, 1, step_sizes,
                             noise_scales, seed, offset)
    (a0, b0), (a1, b1) = [(_vector(a, x, f"{name}[0]"), _vector(b, x, f"{name}[1]")) for name, (a, b) in (("start", start), ("end", end))]
    network, _keep = _network(weights, biases, activations)
    out, loss = torch.empty_like(x), x.new_empty(())
    e0, e1 = x.new_empty(x.shape[:1]), x.new_empty(x.shape[:1])  # two tensors: an op's outputs may not alias
    out_bias = None if biases[-1] is None else torch.empty(1)
    grad_w, grad_b, pointers = _weight_gradients(weights, biases)
    library.host().call("feedforward_contrastive_chain", *network, float(sign), x.data_ptr(), out.data_ptr(), x.shape[0], n_steps,
                        step_size, noise_scale, _ptr(hv), _ptr(sv), seed, offset, a0.data_ptr(), _ptr(b0), a1.data_ptr(), _ptr(b1),
                        e0.data_ptr(), e1.data_ptr(), loss.data_ptr(), _ptr(out_bias), *pointers, torch.get_num_threads())
    return out, e0, e1, loss, grad_w, [*grad_b, out_bias]


# The losses' ops, each through torch.ops.ebm_cuda like the chains: tensors in and out (torch.library's schemas take no
# tuples and return no None in a list), so the bias gradients travel as those of the layers that have a bias, and
# (a, b) pairs as two arguments; the public functions below take and return what the losses use.


def _present(grads: Sequence[Optional[Tensor]]) -> list[Tensor]:
    return [g for g in grads if g is not None]


def _restored(present: Sequence[Tensor], biases: Sequence[Optional[Tensor]], output_bias: bool) -> list[Optional[Tensor]]:
    """The bias gradients per layer (None where a layer has no bias, and for the output bias unless ``output_bias``)."""
    it = iter(present)
    return [None if b is None else next(it) for b in biases[:-1]] + [next(it) if output_bias and biases[-1] is not None else None]


def _fake_gradients(weights: Sequence[Tensor], biases: Sequence[Optional[Tensor]], output_bias: bool) -> tuple[list, list]:
    grad_w = [torch.empty(w.shape, dtype=torch.float32, device=w.device) for w in weights]
    kept = [*biases[:-1], *(biases[-1:] if output_bias else [])]
    return grad_w, [torch.empty(b.shape, dtype=torch.float32, device=b.device) for b in kept if b is not None]


def _dsm_op(x: Tensor, target: Tensor, scale: Optional[Tensor], weights: Sequence[Tensor], biases: Sequence[Optional[Tensor]],
            activations: Sequence[int], sign: float) -> tuple[Tensor, list[Tensor], list[Tensor]]:
    loss, grad_w, grad_b = _feedforward_denoising_score_matching_host(x, target, scale, weights, biases, activations, sign)
    return loss, grad_w, _present(grad_b)


def _ssm_op(x: Tensor, v: Tensor, weights: Sequence[Tensor], biases: Sequence[Optional[Tensor]], activations: Sequence[int],
            sign: float) -> tuple[Tensor, list[Tensor], list[Tensor]]:
    loss, grad_w, grad_b = _feedforward_sliced_score_matching_host(x, v, weights, biases, activations, sign)
    return loss, grad_w, _present(grad_b)


def _energy_gradients_op(x: Tensor, a: Tensor, b: Optional[Tensor], weights: Sequence[Tensor],
                         biases: Sequence[Optional[Tensor]], activations: Sequence[int],
                         sign: float) -> tuple[Tensor, list[Tensor], list[Tensor]]:
    energies, grad_w, grad_b = _feedforward_energy_gradients_host(x, a, b, weights, biases, activations, sign)
    return energies, grad_w, _present(grad_b)


def _contrastive_chain_op(x: Tensor, start_a: Tensor, start_b: Optional[Tensor], end_a: Tensor, end_b: Optional[Tensor],
                          weights: Sequence[Tensor], biases: Sequence[Optional[Tensor]], activations: Sequence[int], sign: float,
                          n_steps: int, step_size: float, noise_scale: float, step_sizes: Optional[Tensor],
                          noise_scales: Optional[Tensor], seed: int,
                          offset: int) -> tuple[Tensor, Tensor, Tensor, Tensor, list[Tensor], list[Tensor]]:
    *head, grad_w, grad_b = _feedforward_contrastive_chain_host(
        x, (start_a, start_b), (end_a, end_b), weights, biases, activations, sign, n_steps, step_size, noise_scale, step_sizes,
        noise_scales, seed, offset)
    return (*head, grad_w, _present(grad_b))


_op("feedforward_denoising_score_matching", _dsm_op)
_op("feedforward_sliced_score_matching", _ssm_op)
_op("feedforward_energy_gradients", _energy_gradients_op)
_op("feedforward_contrastive_chain", _contrastive_chain_op)


@torch.library.register_fake("ebm_cuda::feedforward_denoising_score_matching")
def _(x, target, scale, weights, biases, activations, sign):
    return (x.new_empty(()), *_fake_gradients(weights, biases, False))


@torch.library.register_fake("ebm_cuda::feedforward_sliced_score_matching")
def _(x, v, weights, biases, activations, sign):
    return (x.new_empty(()), *_fake_gradients(weights, biases, False))


@torch.library.register_fake("ebm_cuda::feedforward_energy_gradients")
def _(x, a, b, weights, biases, activations, sign):
    return (x.new_empty(x.shape[:1]), *_fake_gradients(weights, biases, True))


@torch.library.register_fake("ebm_cuda::feedforward_contrastive_chain")
def _(x, start_a, start_b, end_a, end_b, weights, biases, activations, sign, n_steps, step_size, noise_scale, step_sizes,
      noise_scales, seed, offset):
    return (torch.empty_like(x), x.new_empty(x.shape[:1]), x.new_empty(x.shape[:1]), x.new_empty(()),
            *_fake_gradients(weights, biases, True))


def feedforward_denoising_score_matching(x: Tensor, target: Tensor, scale: Optional[Tensor], weights: Sequence[Tensor],
                                         biases: Sequence[Optional[Tensor]], activations: Sequence[int],
                                         sign: float) -> tuple[Tensor, list[Tensor], list[Optional[Tensor]]]:
    """``L = (1/2n) Σᵣ |aᵣ∇E(xᵣ) − bᵣ|²`` for the feed-forward energy of ``feedforward_langevin_chain`` (host build,
    float32), with its gradient in every weight and bias, in one pass over tiles of the batch (the op
    ``torch.ops.ebm_cuda.feedforward_denoising_score_matching``). ``x``, ``target`` (``b``): ``(n, d)``; ``scale``
    (``a``): ``(n,)`` or None for ones. Returns ``(L: (), weight grads, bias grads)`` (None where a layer has no bias,
    and for the output bias, which does not move ``∇E``, as autograd leaves it). Not an autograd op: the caller
    attaches the gradients."""
    loss, grad_w, grad_b = call("feedforward_denoising_score_matching", x, target, scale, list(weights), list(biases),
                                list(activations), float(sign))
    return loss, list(grad_w), _restored(grad_b, biases, False)


def feedforward_sliced_score_matching(x: Tensor, v: Tensor, weights: Sequence[Tensor], biases: Sequence[Optional[Tensor]],
                                      activations: Sequence[int], sign: float) -> tuple[Tensor, list[Tensor], list[Optional[Tensor]]]:
    """``L = (1/n) Σᵣ ½(vᵣᵀ∇E(xᵣ))² − vᵣᵀ∇²E(xᵣ)vᵣ`` (sliced score matching, one direction ``vᵣ`` per row) with its
    gradient in every weight and bias (the op ``torch.ops.ebm_cuda.feedforward_sliced_score_matching``; see
    ``_feedforward_sliced_score_matching_host``). Returns what :func:`feedforward_denoising_score_matching` does."""
    loss, grad_w, grad_b = call("feedforward_sliced_score_matching", x, v, list(weights), list(biases), list(activations),
                                float(sign))
    return loss, list(grad_w), _restored(grad_b, biases, False)


def feedforward_energy_gradients(x: Tensor, a: Tensor, b: Optional[Tensor], weights: Sequence[Tensor],
                                 biases: Sequence[Optional[Tensor]], activations: Sequence[int],
                                 sign: float) -> tuple[Tensor, list[Tensor], list[Optional[Tensor]]]:
    """``E(x): (n,)`` and ``Σᵣ cᵣ ∂E(xᵣ)/∂θ``, ``cᵣ = aᵣ + bᵣE(xᵣ)`` (the op ``torch.ops.ebm_cuda.feedforward_energy_gradients``;
    see ``_feedforward_energy_gradients_host``). Returns ``(E, weight grads, bias grads)`` (None where a layer has no
    bias)."""
    energies, grad_w, grad_b = call("feedforward_energy_gradients", x, a, b, list(weights), list(biases), list(activations),
                                    float(sign))
    return energies, list(grad_w), _restored(grad_b, biases, True)


def feedforward_contrastive_chain(x: Tensor, start: tuple[Tensor, Optional[Tensor]], end: tuple[Tensor, Optional[Tensor]],
                                  weights: Sequence[Tensor], biases: Sequence[Optional[Tensor]], activations: Sequence[int],
                                  sign: float, n_steps: int, step_size: float, noise_scale: float, step_sizes: Optional[Tensor],
                                  noise_scales: Optional[Tensor], seed: int,
                                  offset: int) -> tuple[Tensor, Tensor, Tensor, Tensor, list[Tensor], list[Optional[Tensor]]]:
    """Contrastive divergence's chains, loss and weight gradient in one launch (the op
    ``torch.ops.ebm_cuda.feedforward_contrastive_chain``; see ``_feedforward_contrastive_chain_host``): returns
    ``(x_end, E(x), E(x_end), L: (), weight grads, bias grads)``."""
    *head, grad_w, grad_b = call("feedforward_contrastive_chain", x, start[0], start[1], end[0], end[1], list(weights),
                                 list(biases), list(activations), float(sign), n_steps, step_size, noise_scale, step_sizes,
                                 noise_scales, seed, offset)
    return (*head, list(grad_w), _restored(grad_b, biases, True))


def _weight_gradients(weights: Sequence[Tensor], biases: Sequence[Optional[Tensor]]) -> tuple[list[Tensor], list[Optional[Tensor]], tuple]:
    """Buffers for a kernel's weight and hidden-bias gradients (None where a layer has no bias), and their C pointer arrays."""
    grad_w = [torch.empty(w.shape, dtype=torch.float32) for w in weights]
    grad_b = [None if t is None else torch.empty(t.shape, dtype=torch.float32) for t in biases[:-1]]
    return grad_w, grad_b, ((ctypes.c_void_p * len(grad_w))(*(g.data_ptr() for g in grad_w)),
                            (ctypes.c_void_p * len(grad_b))(*(None if g is None else g.data_ptr() for g in grad_b)))


def _network_input(x: Tensor, what: str, weights: Sequence[Tensor], biases: Sequence[Optional[Tensor]],
                   activations: Sequence[int], noun: str = "inputs") -> Tensor:
    """``x: (n, d)`` checked for a network kernel: float32 on the CPU, and layers that chain from ``d`` to one output."""
    x = _check(x, what)
    if x.device.type != "cpu" or x.dtype != torch.float32:
        raise InputError(f"ebm_cuda.{what}: float32 {noun} on the CPU only, got {x.dtype} on {x.device}.")
    _network_shapes(what, x, weights, biases, activations)
    return x


def _chain_input(x: Tensor, what: str, weights: Sequence[Tensor], biases: Sequence[Optional[Tensor]], activations: Sequence[int],
                 n_steps: int, min_steps: int, step_sizes: Optional[Tensor], noise_scales: Optional[Tensor], seed: int,
                 offset: int) -> tuple[Tensor, Optional[Tensor], Optional[Tensor]]:
    """The checked states of a network chain (float32 on the CPU, layers that chain, ``n_steps >= min_steps``, a valid
    stream position) and its per-chain step sizes and noise scales (None: the scalars)."""
    x = _network_input(x, what, weights, biases, activations, noun="states")
    return (x, *_chain_run(what, x, n_steps, min_steps, step_sizes, noise_scales, seed, offset))


def _network_loss(name: str, weights: Sequence[Tensor], biases: Sequence[Optional[Tensor]], activations: Sequence[int],
                  sign: float, *inputs: object) -> tuple[Tensor, list[Tensor], list[Optional[Tensor]]]:
    """Run the loss kernel ``name`` on ``inputs``: ``(loss: (), weight grads, bias grads)`` (no output-bias gradient)."""
    network, _keep = _network(weights, biases, activations)
    grad_w, grad_b, pointers = _weight_gradients(weights, biases)
    loss = ctypes.c_double(0.0)
    library.host().call(name, *network, float(sign), *inputs, ctypes.byref(loss), *pointers, torch.get_num_threads())
    return torch.tensor(loss.value, dtype=torch.float32), grad_w, [*grad_b, None]


feedforward_langevin_chain = _op("feedforward_langevin_chain", _feedforward_langevin_chain)


@torch.library.register_fake("ebm_cuda::feedforward_langevin_chain")
def _(x, weights, biases, activations, sign, n_steps, step_size, noise_scale, step_sizes, noise_scales, seed, offset):
    return torch.empty_like(x)


def _conv_langevin_chain(x: Tensor, weights: Sequence[Tensor], biases: Sequence[Optional[Tensor]], strides: Sequence[int],
                         activation: int, sign: float, n_steps: int, step_size: float, noise_scale: float,
                         step_sizes: Optional[Tensor], noise_scales: Optional[Tensor], seed: int, offset: int) -> Tensor:
    """``n_steps`` Langevin steps of the convolutional energy ``E(x) = sign · (w · mean_p f(conv_L(… f(conv_1(x)) …)) + b)``
    in one launch (host build, float32): ``x: (n, C, H, W)``; ``weights[l]: (C_{l+1}, C_l, 3, 3)`` for each 3×3
    convolution (padding 1, stride ``strides[l]``) and ``weights[-1]: (1, C_L)`` the head; ``biases[l]: (C_{l+1},)`` or
    None (the head's is unused: it does not move ``∇E``); ``activation``: a code of :data:`ebm_cuda.activations.ACTIVATION_CODES`
    after every convolution. The noise is the stream's for element ``j`` of the flattened image (C-order), as in
    ``langevin_chain``. Returns the new ``x``."""
    if x.dim() != 4:
        raise InputError(f"ebm_cuda.conv_langevin_chain: x must be (n, C, H, W), got shape {tuple(x.shape)}.")
    if x.device.type != "cpu" or x.dtype != torch.float32:
        raise InputError(f"ebm_cuda.conv_langevin_chain: float32 states on the CPU only, got {x.dtype} on {x.device}.")
    hv, sv = _chain_run("conv_langevin_chain", x, n_steps, 0, step_sizes, noise_scales, seed, offset)
    n_layers = len(weights) - 1
    channels = [x.shape[1]]
    if n_layers < 1 or len(biases) != len(weights) or len(strides) != n_layers:
        raise InputError(f"ebm_cuda.conv_langevin_chain: give at least one convolution and the head, one bias (or None) per "
                         f"layer and one stride per convolution; got {len(weights)} weights, {len(biases)} biases, "
                         f"{len(strides)} strides.")
    for l, w in enumerate(weights):
        fits = (w.shape == (1, channels[-1]) if l == n_layers else (w.dim() == 4 and w.shape[1:] == (channels[-1], 3, 3)))
        if not fits:
            raise InputError(f"ebm_cuda.conv_langevin_chain: weights[{l}] of shape {tuple(w.shape)} does not follow "
                             f"{channels[-1]} channels" + (" into one output (1, C)." if l == n_layers else " (a 3×3 kernel: (C_out, C_in, 3, 3))."))
        if l < n_layers and biases[l] is not None and biases[l].shape != (w.shape[0],):
            raise InputError(f"ebm_cuda.conv_langevin_chain: biases[{l}] of shape {tuple(biases[l].shape)} does not fit "
                             f"weights[{l}] {tuple(w.shape)}.")
        channels.append(w.shape[0])
    x = x.contiguous()
    if n_steps == 0:
        return x.clone()
    # the C description of the layers: channels C_0 .. C_L (then the head's 1), weights, biases (the head's unused)
    (_, channel_array, weight_ptrs, bias_ptrs, activation_codes), _keep = _network(weights, biases, [activation] * n_layers)
    out = torch.empty_like(x)
    library.host().call("conv_langevin_chain", n_layers, channel_array, x.shape[2], x.shape[3], (ctypes.c_int * n_layers)(*strides),
                        weight_ptrs, bias_ptrs, activation_codes, float(sign), x.data_ptr(), out.data_ptr(), x.shape[0], n_steps,
                        step_size, noise_scale, _ptr(hv), _ptr(sv), seed, offset, torch.get_num_threads())
    return out


conv_langevin_chain = _op("conv_langevin_chain", _conv_langevin_chain)


@torch.library.register_fake("ebm_cuda::conv_langevin_chain")
def _(x, weights, biases, strides, activation, sign, n_steps, step_size, noise_scale, step_sizes, noise_scales, seed, offset):
    return torch.empty_like(x)


def _langevin_step_philox(x: Tensor, grad: Tensor, step_size: float, noise_scale: float, step_sizes: Optional[Tensor],
                         noise_scales: Optional[Tensor], seed: int, offset: int) -> Tensor:
    """One Langevin step ``x − h·grad + s·ξ`` with ``ξ`` drawn in the kernel (step ``offset`` of the stream)."""
    x = _check(x, "langevin_step_philox")
    _check_stream(seed, offset)
    grad = _like(grad, x, "grad")
    out = torch.empty_like(x)
    hv, sv = _vector(step_sizes, x, "step_sizes"), _vector(noise_scales, x, "noise_scales")
    _run(x.device, "langevin_update", DTYPE_CODES[x.dtype], x.data_ptr(), grad.data_ptr(), out.data_ptr(), x.shape[0], x.shape[1],
         step_size, noise_scale, _ptr(hv), _ptr(sv), seed, offset)
    return out


langevin_step_philox = _op("langevin_step_philox", _langevin_step_philox)


@torch.library.register_fake("ebm_cuda::langevin_step_philox")
def _(x, grad, step_size, noise_scale, step_sizes, noise_scales, seed, offset):
    return torch.empty_like(x)


def _langevin_step(x: Tensor, grad: Tensor, noise: Tensor, step_size: float, noise_scale: float,
                  step_sizes: Optional[Tensor], noise_scales: Optional[Tensor]) -> Tensor:
    """``x − h·grad + s·noise`` in one pass (the core's ``langevin_step`` op)."""
    x = _check(x, "langevin_step")
    grad, noise = _like(grad, x, "grad"), _like(noise, x, "noise")
    out = torch.empty_like(x)
    hv, sv = _vector(step_sizes, x, "step_sizes"), _vector(noise_scales, x, "noise_scales")
    _run(x.device, "langevin_step", DTYPE_CODES[x.dtype], out.data_ptr(), x.data_ptr(), grad.data_ptr(), noise.data_ptr(),
         x.shape[0], x.shape[1], step_size, noise_scale, _ptr(hv), _ptr(sv))
    return out


langevin_step = _op("langevin_step", _langevin_step)


@torch.library.register_fake("ebm_cuda::langevin_step")
def _(x, grad, noise, step_size, noise_scale, step_sizes, noise_scales):
    return torch.empty_like(x)


def call(name: str, *args):
    """Run ``torch.ops.ebm_cuda.<name>`` (eager or under ``torch.compile``, which sees its fake implementation), with
    grad mode off: the ops have no autograd formula, and a network's weights (parameters) among the inputs must not
    make the states they return require grad (the energy and gradient kernels run the torch reference instead where
    a graph is needed)."""
    with torch.no_grad():
        return _OPS[name](*args)


def normal(n: int, d: int, seed: int, step: int, device: torch.device | str = "cpu") -> Tensor:
    """The stream's standard normals ``(n, d)`` (float32) at ``step``: the noise a fused kernel adds there."""
    device = torch.device(device)
    out = torch.empty(n, d, dtype=torch.float32, device=device)
    _check_stream(seed, step)
    _run(device, "normal", out.data_ptr(), n, d, seed, step)
    return out


def uniform(n: int, seed: int, step: int) -> Tensor:
    """The stream's Metropolis uniforms ``(n,)`` in [0, 1) at ``step`` (host build; float32)."""
    _check_stream(seed, step)
    out = torch.empty(n, dtype=torch.float32)
    library.host().call("uniform", out.data_ptr(), n, seed, step)
    return out


def philox4x32(counters: Tensor, keys: Tensor) -> Tensor:
    """Philox4x32-10 of ``counters: (n, 4)`` under ``keys: (n, 2)`` (int64 holding uint32 words) -> ``(n, 4)``."""
    device = counters.device
    c = counters.to(torch.int64).to(torch.int32).contiguous()  # the same 32 bits
    k = keys.to(torch.int64).to(torch.int32).contiguous()
    out = torch.empty_like(c)
    if _cuda_build(device):  # the C functions take a stream there
        _run(device, "philox", c.data_ptr(), k.data_ptr(), out.data_ptr(), c.shape[0])
    else:
        library.host().call("philox", c.data_ptr(), k.data_ptr(), out.data_ptr(), c.shape[0])
    return out.to(torch.int64) & 0xFFFFFFFF
