"""The kernels as PyTorch ops, registered with ``torch.library`` as ``torch.ops.ebm_cuda.*``: the names users and the
docs import, gathered from the modules that define them.

- :mod:`ebm_cuda.dispatch`: what every op shares (registration, :func:`call`, :func:`math_dtype`, the checks, the
  launch on the build that matches the tensors' device);
- :mod:`ebm_cuda.analytic_ops`: the analytic energies' ops (energies and gradients, the fused Langevin, HMC and NUTS
  chains, the step kernels), on the host build and the CUDA build;
- :mod:`ebm_cuda.feedforward_ops`, :mod:`ebm_cuda.contrastive_op`, :mod:`ebm_cuda.conv_ops`: the network ops
  (feed-forward and convolutional Langevin chains, the losses' ops with their weight gradients), on the host build;
- :mod:`ebm_cuda.philox`: the Philox stream the kernels draw from (:func:`normal`, :func:`uniform`, :func:`philox4x32`).

The Triton kernels' two ops are :mod:`ebm_cuda.triton_chains`' and :mod:`ebm_cuda.triton_contrastive`'. Every op is
one row of :mod:`ebm_cuda.native`. The tests' machinery (``cuda_emulation``, the GPU tests' helpers) is
:mod:`ebm_cuda.testing`'s, which the runtime never imports.
"""

from __future__ import annotations

from ebm_cuda.analytic_ops import (
    KINDS,
    MAX_CUDA_CHAIN_DIM,
    energy,
    hmc_chain,
    langevin_chain,
    langevin_step,
    langevin_step_philox,
    nuts_chain,
)
from ebm_cuda.dispatch import call, math_dtype
from ebm_cuda.contrastive_op import feedforward_contrastive_chain
from ebm_cuda.conv_ops import conv_langevin_chain
from ebm_cuda.feedforward_ops import (
    feedforward_denoising_score_matching,
    feedforward_energy_gradients,
    feedforward_langevin_chain,
    feedforward_sliced_score_matching,
)
from ebm_cuda.philox import normal, philox4x32, uniform

__all__ = [
    "KINDS",
    "MAX_CUDA_CHAIN_DIM",
    "call",
    "feedforward_denoising_score_matching",
    "feedforward_sliced_score_matching",
    "feedforward_energy_gradients",
    "feedforward_contrastive_chain",
    "math_dtype",
    "normal",
    "philox4x32",
    "uniform",
    # the op handles (torch.ops.ebm_cuda.*) of the chains and energies
    "energy",
    "hmc_chain",
    "langevin_chain",
    "langevin_step",
    "langevin_step_philox",
    "nuts_chain",
    "conv_langevin_chain",
    "feedforward_langevin_chain",
]
