"""The kernel backends of ebm-cuda: ``cuda`` (the CUDA build), ``cpu_fused`` (the host build) and ``triton`` (the
Triton kernels of :mod:`ebm_cuda.triton_chains`: ``feedforward_langevin_chain`` and ``feedforward_contrastive_chain``
on CUDA).

Both implement, for the analytic energies of ``csrc/ebm/energies.h`` (:data:`ebm_cuda.energies.KINDS`:
``gaussian``, ``double_well``, ``rosenbrock`` and ``harmonic``), the ops ``<energy>_energy`` and
``<energy>_gradient``, the fused chains
``<energy>_langevin_chain``, ``<energy>_hmc_chain`` and ``<energy>_nuts_chain`` (signatures in :mod:`ebmcore.kernels.ops`),
and ``langevin_step`` and ``langevin_step_philox`` (kernels made here, one per energy of :data:`LAYOUTS`). The host
build also runs Langevin chains of feed-forward networks (``feedforward_langevin_chain``: float32, the activations of
:mod:`ebm_cuda.activations`) and
their denoising and sliced score matching losses with their weight gradients
(``feedforward_denoising_score_matching``, ``feedforward_sliced_score_matching``), and the energies with the weight
gradient of a loss linear or quadratic in them (``feedforward_energy_gradients``: contrastive divergence), also
fused with the chain that draws the negatives (``feedforward_contrastive_chain``), and the chain of a convolutional
energy (``conv_langevin_chain``). Those network kernels, and the Triton backend's, are the ones the native ops' rows
carry (:func:`ebm_cuda.native.kernels`): an op module adds its kernel with its row, not here.

Priorities: on CUDA every kernel outranks the ``torch`` reference (10 against 0), but the energy and gradient kernels
of the energies measured slower than it (:data:`CUDA_PER_OP_SLOWER`: the double well; -10). On the CPU the
plain energy, gradient and step kernels rank below it (-10: selected only by name, e.g.
``EBM_BACKEND=cpu_fused,torch``, as the tests do; PyTorch's own ops are as fast, and its
vectorised normal generator beats the per-chain ``langevin_step_philox`` there), while the fused
chains, vectorised across chains, rank 10 and are used by the samplers automatically.

A call whose inputs require grad (with grad mode on) runs the ``torch`` reference instead, so
autograd, ``create_graph`` and Hessian-vector products work exactly as on the reference path.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import Tensor

from ebmcore.kernels import torch_backend
from ebmcore.kernels.base import Kernel, KernelBackend
from ebm_cuda import library, native, triton_chains
from ebm_cuda.energies import LAYOUTS
from ebm_cuda.analytic_ops import MAX_CUDA_CHAIN_DIM
from ebm_cuda.dispatch import _scalar_or_vector, call

__all__ = ["CudaBackend", "HostBackend", "TritonBackend", "CUDA_DTYPES", "HOST_DTYPES", "CUDA_PER_OP_SLOWER"]

CUDA_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
HOST_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
MIN_COMPUTE_CAPABILITY = (7, 5)
"""The oldest GPUs nvcc 12/13 still targets (Turing); the kernels are built for the device's own capability."""


def _needs_graph(x: Tensor, params: tuple[Any, ...]) -> bool:
    return torch.is_grad_enabled() and (x.requires_grad or any(isinstance(p, Tensor) and p.requires_grad for p in params))


def _energy_kernel(name: str, gradient: bool) -> Callable[..., Tensor]:
    layout = LAYOUTS[name]
    kind, unpack = layout.code, layout.unpack
    reference = layout.energy.reference_gradient if gradient else layout.energy.reference_energy

    def run(x: Tensor, *params: Any) -> Tensor:
        if _needs_graph(x, params):
            return reference(x, *params)
        return call("energy", x, kind, *unpack(*params), gradient)

    run.__name__ = run.__qualname__ = f"{name}_{'gradient' if gradient else 'energy'}"
    run.__doc__ = reference.__doc__
    return run


def _langevin_chain_kernel(name: str) -> Callable[..., Tensor]:
    kind, unpack = LAYOUTS[name].code, LAYOUTS[name].unpack

    def run(x: Tensor, *params: Any, n_steps: int, step_size: Any, noise_scale: Any, seed: int, offset: int) -> Tensor:
        h, hv = _scalar_or_vector(step_size)
        s, sv = _scalar_or_vector(noise_scale)
        return call("langevin_chain", x, kind, *unpack(*params), n_steps, h, s, hv, sv, seed, offset)

    run.__name__ = run.__qualname__ = f"{name}_langevin_chain"
    return run


def _hmc_chain_kernel(name: str) -> Callable[..., tuple[Tensor, Tensor, Tensor]]:
    kind, unpack = LAYOUTS[name].code, LAYOUTS[name].unpack

    def run(
        x: Tensor,
        *params: Any,
        n_steps: int,
        step_size: Any,
        n_leapfrog_steps: int,
        inverse_temperature: float,
        seed: int,
        offset: int,
    ) -> tuple[Tensor, Tensor, Tensor]:
        h, hv = _scalar_or_vector(step_size)
        return call(
            "hmc_chain", x, kind, *unpack(*params), n_steps, h, hv, n_leapfrog_steps, float(inverse_temperature), seed, offset
        )

    run.__name__ = run.__qualname__ = f"{name}_hmc_chain"
    return run


def _nuts_chain_kernel(name: str) -> Callable[..., tuple[Tensor, ...]]:
    kind, unpack = LAYOUTS[name].code, LAYOUTS[name].unpack

    def run(
        x: Tensor,
        *params: Any,
        n_steps: int,
        step_size: Any,
        max_tree_depth: int,
        inverse_temperature: float,
        seed: int,
        offset: int,
    ) -> tuple[Tensor, ...]:
        h, hv = _scalar_or_vector(step_size)
        return call(
            "nuts_chain", x, kind, *unpack(*params), n_steps, h, hv, max_tree_depth, float(inverse_temperature), seed, offset
        )

    run.__name__ = run.__qualname__ = f"{name}_nuts_chain"
    return run


def _flat(t: Tensor) -> Tensor:
    """A state ``(n, *event_shape)`` as ``(n, d)`` (the step kernels are element-wise per chain)."""
    return t.reshape(t.shape[0], -1)


def langevin_step(x: Tensor, grad: Tensor, noise: Tensor, step_size: Any, noise_scale: Any) -> Tensor:
    """``x − step_size·grad + noise_scale·noise`` in one pass; ``x: (n, *event_shape)``."""
    if _needs_graph(x, (grad, noise, step_size, noise_scale)):
        return torch_backend.langevin_step(x, grad, noise, step_size, noise_scale)
    h, hv = _scalar_or_vector(step_size)
    s, sv = _scalar_or_vector(noise_scale)
    return call("langevin_step", _flat(x), _flat(grad), _flat(noise), h, s, hv, sv).view(x.shape)


def langevin_step_philox(x: Tensor, grad: Tensor, step_size: Any, noise_scale: Any, seed: int, offset: int) -> Tensor:
    """``x − step_size·grad + noise_scale·ξ``, ``ξ`` drawn in the kernel at step ``offset`` of the
    stream (element ``j`` of the flattened chain); ``x: (n, *event_shape)``."""
    h, hv = _scalar_or_vector(step_size)
    s, sv = _scalar_or_vector(noise_scale)
    return call("langevin_step_philox", _flat(x), _flat(grad), h, s, hv, sv, seed, offset).view(x.shape)


HOST_CHAINS_PAY_UP_TO = {"gaussian_langevin_chain": 128, "gaussian_hmc_chain": 64, "gaussian_nuts_chain": 32}
"""Where the host build's chains stop beating the per-step loop (``Kernel.pays_up_to``), measured by
``benchmarks/fused_boundary.py`` (1 thread, 100 and 1,000 chains; ``benchmarks/boundary/``): the Gaussian's gradient
costs ``d²`` per chain in the kernel, where the per-step loop's is one matrix product over all chains (NUTS on 100
chains: 2.1× faster fused at d = 50, 2× slower at d = 100, 10× at d = 400); the other energies' gradients cost ``d``
and the fused chains win at every measured size (NUTS on the double well: 8× at d = 128)."""


CUDA_PER_OP_SLOWER = {
    "double_well": "102.8 ms against eager torch's 57.8 ms (float32), 129.0 against 52.4 (bfloat16), 87.0 against 49.7 (float16)"
}
"""Energies whose per-op ``cuda`` energy and gradient kernels were measured slower than the ``torch`` reference's ops
(G1's per-step loop, 1,000,000 chains × 1,000 steps, an H200, 2026-11-26, ``benchmarks/results/2026-11-26-gpu-h200.md``):
they rank below it (priority -10), selected only by name. The Gaussian (184 against 186 ms) and Rosenbrock (181
against 413 ms) kernels keep their rank. The fused chains are not affected (8× eager on the double well)."""


def _kernels(
    device: str,
    dtypes: tuple[torch.dtype, ...],
    plain: int,
    fused: int,
    max_chain: int | None,
    capability: tuple[int, int] | None,
    pays_up_to: dict[str, int] | None = None,
    slower: dict[str, str] | None = None,
) -> list[Kernel]:
    def kernel(op: str, fn: Callable[..., Any], priority: int, max_event_size: int | None = None) -> Kernel:
        return Kernel(op, fn, (device,), dtypes, capability, priority, max_event_size, pays_up_to=(pays_up_to or {}).get(op))

    kernels = [kernel("langevin_step", langevin_step, plain), kernel("langevin_step_philox", langevin_step_philox, plain)]
    for name in LAYOUTS:
        kernels += [
            kernel(f"{name}_energy", _energy_kernel(name, False), -10 if name in (slower or {}) else plain),
            kernel(f"{name}_gradient", _energy_kernel(name, True), -10 if name in (slower or {}) else plain),
            kernel(f"{name}_langevin_chain", _langevin_chain_kernel(name), fused, max_chain),
            kernel(f"{name}_hmc_chain", _hmc_chain_kernel(name), fused, max_chain),
            kernel(f"{name}_nuts_chain", _nuts_chain_kernel(name), fused, max_chain),
        ]
    return kernels


class CudaBackend(KernelBackend):
    """The CUDA build: float32, bfloat16 and float16 states (math in float32) on CUDA devices."""

    def __init__(self) -> None:
        super().__init__(
            "cuda",
            _kernels("cuda", CUDA_DTYPES, 10, 10, MAX_CUDA_CHAIN_DIM, MIN_COMPUTE_CAPABILITY, slower=CUDA_PER_OP_SLOWER),
            description="ebm-cuda: CUDA kernels (fused Langevin/HMC/NUTS chains with in-kernel Philox RNG)",
        )

    def unavailable_reason(self) -> str | None:
        return library.cuda_unavailable_reason()


class HostBackend(KernelBackend):
    """The host build of the same kernels: float16, bfloat16, float32 and float64 states on the CPU."""

    def __init__(self) -> None:
        super().__init__(
            "cpu_fused",
            [*_kernels("cpu", HOST_DTYPES, -10, 10, None, None, HOST_CHAINS_PAY_UP_TO), *native.kernels("cpu_fused")],
            description="ebm-cuda: the kernels built for the CPU (fused chains, vectorised over chains)",
        )

    def unavailable_reason(self) -> str | None:
        return library.host_unavailable_reason()


class TritonBackend(KernelBackend):
    """The Triton kernels of :mod:`ebm_cuda.triton_chains` on CUDA (float32, bfloat16 and float16 states, math in
    float32): the fused Langevin chain of a feed-forward energy, and the same chain with contrastive divergence's
    energies, loss and weight gradient (``feedforward_contrastive_chain``, one of the losses' fused ops). Triton is
    imported only where a CUDA device is seen. Both rank above the per-step loop
    (:data:`ebm_cuda.triton_chains.TRITON_CHAIN_PRIORITY`) with the products an H100 sweep measured faster (TF32,
    bfloat16; each kernel declares its products, ``fn.products``), and run with others only with ``fused=True``;
    contrastive divergence runs its op only where its sampler runs that chain."""

    def __init__(self) -> None:
        super().__init__(
            "triton",
            native.kernels("triton"),
            description="ebm-cuda: Triton kernels (fused Langevin chains of feed-forward networks, and "
            "contrastive divergence's, on CUDA)",
        )

    def unavailable_reason(self) -> str | None:
        return triton_chains.unavailable_reason()
