"""The ops kernels implement: their signatures and sample inputs, for contract checks.

Every backend's kernel for an op must agree with the ``torch`` reference
(:mod:`ebmcore.kernels.torch_backend`) on these inputs; see
:func:`ebmcore.testing.check_kernel`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

__all__ = ["OpSpec", "OPS", "FUSED_OPS", "sample_inputs"]


@dataclass(frozen=True)
class OpSpec:
    name: str
    signature: str
    make_inputs: Callable[[int, int, torch.Generator], tuple[Any, ...]]  # (n, d, generator) -> float64 args


def _randn(*shape: int, g: torch.Generator) -> torch.Tensor:
    return torch.randn(*shape, generator=g, dtype=torch.float64)


def _gaussian(n: int, d: int, g: torch.Generator) -> tuple[Any, ...]:
    a = _randn(d, d, g=g)
    return _randn(n, d, g=g), _randn(d, g=g), a @ a.T / d + torch.eye(d, dtype=torch.float64)


def _mixture(n: int, d: int, g: torch.Generator) -> tuple[Any, ...]:
    k = 3
    stds = 0.5 + torch.rand(k, d, generator=g, dtype=torch.float64)
    log_w = torch.log_softmax(_randn(k, g=g), 0)
    return 2 * _randn(n, d, g=g), 2 * _randn(k, d, g=g), stds, log_w


def _elementwise(*params: float) -> Callable[[int, int, torch.Generator], tuple[Any, ...]]:
    return lambda n, d, g: (1.5 * _randn(n, d, g=g), *params)


def _harmonic(n: int, d: int, g: torch.Generator) -> tuple[Any, ...]:
    return _randn(n, d, g=g), _randn(d, g=g), 2.5


OPS: dict[str, OpSpec] = {}
for _base, _sig, _make in [
    ("gaussian", "x: (n, d), mean: (d,), precision: (d, d)", _gaussian),
    ("gaussian_mixture", "x: (n, d), means: (K, d), stds: (K, d), log_weights: (K,)", _mixture),
    ("double_well", "x: (n, d), barrier: float", _elementwise(1.0)),
    ("rosenbrock", "x: (n, d >= 2), a: float, b: float", _elementwise(1.0, 100.0)),
    ("harmonic", "x: (n, d), center: (d,), stiffness: float", _harmonic),
    ("ackley", "x: (n, d), a: float, b: float, c: float", _elementwise(20.0, 0.2, 2 * torch.pi)),
    ("rastrigin", "x: (n, d), amplitude: float", _elementwise(10.0)),
]:
    OPS[f"{_base}_energy"] = OpSpec(f"{_base}_energy", f"({_sig}) -> energy: (n,)", _make)
    OPS[f"{_base}_gradient"] = OpSpec(f"{_base}_gradient", f"({_sig}) -> gradient: (n, d)", _make)


def _langevin(n: int, d: int, g: torch.Generator) -> tuple[Any, ...]:
    return _randn(n, d, g=g), _randn(n, d, g=g), _randn(n, d, g=g), 0.01, 0.1414


OPS["langevin_step"] = OpSpec(
    "langevin_step",
    "(x: (n, d), grad: (n, d), noise: (n, d), step_size: float | (n, 1), noise_scale: float | (n, 1)) -> x': (n, d)",
    _langevin,
)


FUSED_OPS: dict[str, str] = {
    "<energy>_langevin_chain": "(x: (n, d), *energy_args, n_steps: int, step_size: float | (n,), noise_scale: float | (n,), "
                               "seed: int, offset: int) -> x': (n, d)",
    "<energy>_hmc_chain": "(x: (n, d), *energy_args, n_steps: int, step_size: float | (n,), n_leapfrog_steps: int, "
                          "inverse_temperature: float, seed: int, offset: int) -> (x': (n, d), accepted: (n,), divergent: (n,))",
    "langevin_step_philox": "(x: (n, d), grad: (n, d), step_size, noise_scale, seed: int, offset: int) -> x': (n, d)",
}
"""Ops with no ``torch`` reference: many steps per launch, the noise drawn inside the kernel from a
counter-based stream keyed by ``seed`` at steps ``offset, offset + 1, ...`` (``ebm-cuda`` defines it:
Philox4x32-10, ``ebm_cuda.reference``). ``<energy>`` is an :class:`~ebmcore.energies.AnalyticEnergy`'s
``op`` and ``energy_args`` its ``kernel_args()``. Samplers call them when a backend provides them
(``MCMCSampler(fused=...)``) and otherwise run their per-step loop, so forcing ``EBM_BACKEND=torch``
selects the reference path."""


def sample_inputs(op: str, n: int = 64, d: int = 4, *, dtype: torch.dtype = torch.float64, device: Any = "cpu", seed: int = 0) -> tuple[Any, ...]:
    """Deterministic sample arguments for ``op``, tensors cast to ``dtype`` on ``device``."""
    g = torch.Generator().manual_seed(seed)
    args = OPS[op].make_inputs(n, d, g)
    return tuple(a.to(device=device, dtype=dtype) if isinstance(a, torch.Tensor) else a for a in args)
