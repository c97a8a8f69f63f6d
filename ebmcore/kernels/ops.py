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
from ebmcore.kernels.fused import FusedOp

__all__ = ["OpSpec", "OPS", "FusedOp", "energy_ops", "op_spec", "sample_inputs"]


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
    raise KeyError(
        f"op {op!r} has no spec: it is neither a builtin op ({', '.join(sorted(OPS))}) nor an op of a registered analytic energy"
    )


def sample_inputs(
    op: str, n: int = 64, d: int = 4, *, dtype: torch.dtype = torch.float64, device: Any = "cpu", seed: int = 0
) -> tuple[Any, ...]:
    """Deterministic sample arguments for ``op``, tensors cast to ``dtype`` on ``device``."""
    g = torch.Generator().manual_seed(seed)
    args = op_spec(op).make_inputs(n, d, g)
    return tuple(a.to(device=device, dtype=dtype) if isinstance(a, torch.Tensor) else a for a in args)
