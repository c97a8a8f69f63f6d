"""Fused multi-step chains: resolving a chain kernel like any other kernel op, and keying its noise.

A kernel backend (``ebm-cuda``) may provide ``<energy>_langevin_chain``, ``<energy>_hmc_chain`` and
``langevin_step_philox`` (:data:`ebmcore.kernels.ops.FUSED_OPS`): many transitions per launch, the
noise drawn inside the kernel from a counter-based stream keyed once per run. An algorithm's
``build_chain`` resolves the op it needs with :func:`chain_kernel`; the per-step loop is the
reference every fused kernel competes with, at priority 0. The stream's key is drawn once per run
by the loop (``ebmcore.sampler.stream_seed``).
"""

from __future__ import annotations

from torch import Tensor

from ebmcore import EnergyModel
from ebmcore.energies.analytic import AnalyticEnergy
from ebmcore.errors import BackendUnavailableError, UnknownComponentError
from ebmcore.kernels import Kernel, resolve_kernel

__all__ = ["chain_kernel"]


def chain_kernel(op: str, energy: EnergyModel, x: Tensor, fused: bool | None) -> Kernel | str:
    """The kernel of fused ``op`` for states ``x``, or why none can run here. ``"<energy>_..."`` ops
    need an analytic energy (``<energy>`` is its ``op``). With ``fused=None`` (automatic) a kernel
    is used only if it ranks above the per-step loop (priority > 0); ``fused=True`` takes any that can run."""
    if op.startswith("<energy>"):
        if not isinstance(energy, AnalyticEnergy):
            return f"{type(energy).__name__} is not an analytic energy"
        op = op.replace("<energy>", energy.op)
    try:
        kernel = resolve_kernel(op, x.device, x.dtype, getattr(energy, "backend", None))
    except (BackendUnavailableError, UnknownComponentError) as exc:
        return f"no kernel for {op}: {str(exc).splitlines()[0]}"
    if kernel.max_event_size is not None and x[0].numel() > kernel.max_event_size:
        return f"the {op} kernel takes at most {kernel.max_event_size} elements per chain, got {x[0].numel()}"
    if kernel.priority < 0 and fused is None:
        return f"the {op} kernel ranks below the per-step loop here (priority {kernel.priority}); fused=True forces it"
    return kernel
