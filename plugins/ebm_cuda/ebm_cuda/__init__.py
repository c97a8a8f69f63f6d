"""ebm-cuda: CUDA kernels for ebm, and the same kernels built for the CPU.

Fused Langevin and HMC chains for the analytic energies with the normal draws generated in the
kernel (Philox4x32-10), energies and gradients, and a Langevin step with in-kernel noise for any
energy. The kernels are registered as the ``cuda`` and ``cpu_fused`` backends; the samplers use
the fused chains automatically. Without a CUDA device or toolkit the ``cuda`` backend reports why
it is unavailable (``ebm backends``); the package installs everywhere.
"""

from __future__ import annotations

from ebm_cuda.library import KernelError, cuda_unavailable_reason, host_unavailable_reason

__version__ = "0.1.0"
__all__ = ["KernelError", "cuda_unavailable_reason", "host_unavailable_reason", "__version__"]
