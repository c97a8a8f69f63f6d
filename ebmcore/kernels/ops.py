"""The ops kernels implement: their signatures and sample inputs, for contract checks.

Every backend's kernel for an op must agree with the ``torch`` reference
(:mod:`ebmcore.kernels.torch_backend`) on these inputs; see
:func:`ebmcore.testing.check_kernel`. The energy ops are derived from the
parameter tables of the analytic energies (:func:`energy_ops`): ``OPS`` holds
those of the builtin energies, and :func:`op_spec` also finds those of the
analytic energies that plugins register.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from ebmcore.energies.analytic import AnalyticEnergy
from ebmcore.energies.catalog import builtin_analytic_energies

__all__ = ["OpSpec", "OPS", "FUSED_OPS", "energy_ops", "op_spec", "sample_inputs"]


@dataclass(frozen=True)
class OpSpec:
    """An op's signature (for people) and its sample inputs (for contract checks)."""

    name: str
    signature: str
    make_inputs: Callable[[int, int, torch.Generator], tuple[Any, ...]]  # (n, d, generator) -> float64 args


def _energy_inputs(energy: type[AnalyticEnergy]) -> Callable[[int, int, torch.Generator], tuple[Any, ...]]:
    def make(n: int, d: int, g: torch.Generator) -> tuple[Any, ...]:
        x = energy.sample_scale * torch.randn(n, d, generator=g, dtype=torch.float64)
        return (x, *(p.sample_value(d, g) for p in energy.params))

    return make


def energy_ops(energy: type[AnalyticEnergy]) -> dict[str, OpSpec]:
    """The specs of ``energy``'s ops ``<op>_energy`` and ``<op>_gradient``, from its parameter table:
    ``x: sample_scale · N(0, 1)`` of shape ``(n, d)``, then each parameter's sample value."""
    x = "x: (n, d)" if energy.min_dim <= 1 else f"x: (n, d >= {energy.min_dim})"
    args = ", ".join([x, *(p.signature() for p in energy.params)])
    make = _energy_inputs(energy)
    return {
        f"{energy.op}_energy": OpSpec(f"{energy.op}_energy", f"({args}) -> energy: (n,)", make),
        f"{energy.op}_gradient": OpSpec(f"{energy.op}_gradient", f"({args}) -> gradient: (n, d)", make),
    }


OPS: dict[str, OpSpec] = {}
for _energy in builtin_analytic_energies().values():
    OPS.update(energy_ops(_energy))


def _langevin(n: int, d: int, g: torch.Generator) -> tuple[Any, ...]:
    def randn() -> torch.Tensor:
        return torch.randn(n, d, generator=g, dtype=torch.float64)

    return randn(), randn(), randn(), 0.01, 0.1414


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
    "<energy>_nuts_chain": "(x: (n, d), *energy_args, n_steps: int, step_size: float | (n,), max_tree_depth: int, "
                           "inverse_temperature: float, seed: int, offset: int) -> (x': (n, d), acceptance: (n,), divergent: (n,), "
                           "n_leapfrog: (n,), tree_depth: (n,))",
    "langevin_step_philox": "(x: (n, d), grad: (n, d), step_size, noise_scale, seed: int, offset: int) -> x': (n, d)",
    "feedforward_langevin_chain": "(x: (n, d), network: ebmcore.energies.program.FeedForward, n_steps: int, "
                                  "step_size: float | (n,), noise_scale: float | (n,), seed: int, offset: int) -> x': (n, d)",
    "conv_langevin_chain": "(x: (n, C, H, W), stack: ebmcore.energies.program.ConvStack, n_steps: int, step_size: float | (n,), "
                           "noise_scale: float | (n,), seed: int, offset: int) -> x': (n, C, H, W)",
}
"""The fused chains, with no ``torch`` reference: they run many steps per launch, the noise drawn inside the kernel
from a counter-based stream keyed by ``seed`` at steps ``offset, offset + 1, ...`` (``ebm-cuda`` defines it:
Philox4x32-10, ``ebm_cuda.reference``); ``<energy>`` is an :class:`~ebmcore.energies.AnalyticEnergy`'s ``op``
and ``energy_args`` its ``kernel_args()``. ``feedforward_langevin_chain`` and ``conv_langevin_chain`` run the ULA
chains of an energy whose program (:mod:`ebmcore.energies.program`) is a ``FeedForward`` network or a
``ConvStack``. Samplers call them when a backend provides them (``fused=`` of the samplers) and otherwise run
their torch path, so forcing ``EBM_BACKEND=torch`` selects the reference path. Plugins define the ops of their own
components where they use them (the losses': ``ebm_losses.ops.LOSS_OPS``)."""


def op_spec(op: str) -> OpSpec:
    """The spec of ``op``: from ``OPS``, else from the parameter table of an analytic energy registered in the
    plugin session. Raises ``KeyError`` naming the known ops."""
    if op in OPS:
        return OPS[op]
    from ebmcore.kernels.torch_backend import registered_analytic_energies

    for energy in registered_analytic_energies():
        if energy.kernel_args is not AnalyticEnergy.kernel_args:
            continue  # its arguments are written by hand, not declared in a table
        specs = energy_ops(energy)
        if op in specs:
            return specs[op]
    raise KeyError(f"op {op!r} has no spec: it is neither a builtin op ({', '.join(sorted(OPS))}) nor an op of a registered "
                   "analytic energy")


def sample_inputs(op: str, n: int = 64, d: int = 4, *, dtype: torch.dtype = torch.float64, device: Any = "cpu", seed: int = 0) -> tuple[Any, ...]:
    """Deterministic sample arguments for ``op``, tensors cast to ``dtype`` on ``device``."""
    g = torch.Generator().manual_seed(seed)
    args = op_spec(op).make_inputs(n, d, g)
    return tuple(a.to(device=device, dtype=dtype) if isinstance(a, torch.Tensor) else a for a in args)
