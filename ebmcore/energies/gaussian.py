"""Gaussian and Gaussian-mixture energies, with their parameter tables and ``torch`` reference kernels."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from ebmcore.energies.analytic import AnalyticEnergy
from ebmcore.energies.params import matrix, tensor, vector
from ebmcore.errors import InputError
from ebmcore.validation import check_placement, check_positive_int, parameter_tensor

__all__ = ["GaussianEnergy", "GaussianMixtureEnergy"]

_LOG_2PI = math.log(2.0 * math.pi)
_SAMPLE_COMPONENTS = 3  # K of the mixture's sample inputs


def _mixture_log_components(x: Tensor, means: Tensor, stds: Tensor, log_weights: Tensor) -> tuple[Tensor, Tensor]:
    """``log w_k N(x; m_k, diag(s_k²)): (n, K)`` and the standardised ``z: (n, K, d)``."""
    z = (x.unsqueeze(1) - means) / stds  # (n, K, d)
    d = x.shape[-1]
    log_comp = log_weights - stds.log().sum(-1) - 0.5 * d * _LOG_2PI - 0.5 * (z * z).sum(-1)  # (n, K)
    return log_comp, z


class GaussianEnergy(AnalyticEnergy):
    """``E(x) = 0.5 (x-m)^T P (x-m)`` with mean ``m: (d,)`` and precision ``P = Σ⁻¹: (d, d)``.

    Give ``covariance`` or ``precision`` (not both; symmetric positive
    definite), or neither for the identity. ``dim`` is needed only when no
    tensor fixes it. Unnormalised: ``E(m) = 0``.
    """

    op = "gaussian"
    params = (vector("mean"), matrix("precision", doc="symmetric positive definite"))

    def __init__(
        self,
        mean: Any = None,
        covariance: Any = None,
        precision: Any = None,
        *,
        dim: int | None = None,
        dtype: torch.dtype | None = None,
        device: Any = None,
        backend: str | None = None,
    ) -> None:
        dtype, device = check_placement(dtype, device, "GaussianEnergy")
        if covariance is not None and precision is not None:
            raise InputError("GaussianEnergy: give covariance or precision, not both.")
        matrix = covariance if covariance is not None else precision
        tensors = {k: parameter_tensor(v, k, dtype, device) for k, v in (("mean", mean), ("matrix", matrix)) if v is not None}
        dims = {"dim": check_positive_int(dim, "GaussianEnergy: dim")} if dim is not None else {}
        if "mean" in tensors:
            if tensors["mean"].dim() != 1:
                raise InputError(f"GaussianEnergy: mean must have shape (d,), got {tuple(tensors['mean'].shape)}.")
            dims["mean"] = tensors["mean"].shape[0]
        if "matrix" in tensors:
            m = tensors["matrix"]
            name = "covariance" if covariance is not None else "precision"
            if m.dim() != 2 or m.shape[0] != m.shape[1]:
                raise InputError(f"GaussianEnergy: {name} must be a square (d, d) matrix, got {tuple(m.shape)}.")
            dims[name] = m.shape[0]
        if not dims:
            raise InputError("GaussianEnergy: give dim, mean, covariance or precision.")
        if len(set(dims.values())) > 1:
            raise InputError(f"GaussianEnergy: inconsistent dimensions {dims}.")
        d = next(iter(dims.values()))
        super().__init__(d, backend)
        dtype = dtype or next((t.dtype for t in tensors.values()), torch.get_default_dtype())
        eye = torch.eye(d, dtype=dtype, device=device)
        mean_t = tensors.get("mean", torch.zeros(d, dtype=dtype, device=device)).to(dtype)
        matrix_t = tensors.get("matrix", eye).to(dtype)
        name = "covariance" if covariance is not None else "precision"
        if not torch.allclose(matrix_t, matrix_t.T, rtol=1e-5, atol=1e-6 * float(matrix_t.abs().max())):
            raise InputError(f"GaussianEnergy: {name} is not symmetric; pass (A + A.T) / 2.")
        matrix_t = 0.5 * (matrix_t + matrix_t.T)
        chol, info = torch.linalg.cholesky_ex(matrix_t)
        if int(info) != 0:
            raise InputError(f"GaussianEnergy: {name} is not positive definite (Cholesky failed at column {int(info)}).")
        inverse = torch.cholesky_inverse(chol)
        inverse = 0.5 * (inverse + inverse.T)
        cov, prec = (matrix_t, inverse) if covariance is not None else (inverse, matrix_t)
        self.set_parameters(mean=mean_t, precision=prec)
        self.register_buffer("covariance", cov)

    @staticmethod
    def reference_energy(x: Tensor, mean: Tensor, precision: Tensor) -> Tensor:
        """``0.5 (x-m)^T P (x-m)``; ``x: (n, d)``, ``mean: (d,)``, ``precision: (d, d)`` symmetric -> ``(n,)``."""
        diff = x - mean
        return 0.5 * ((diff @ precision) * diff).sum(-1)

    @staticmethod
    def reference_gradient(x: Tensor, mean: Tensor, precision: Tensor) -> Tensor:
        """``P (x-m)`` (``P`` symmetric): ``(n, d)``."""
        return (x - mean) @ precision


class GaussianMixtureEnergy(AnalyticEnergy):
    """``E(x) = -log Σ_k w_k N(x; m_k, diag(s_k²))`` -- normalised, so ``exp(-E)`` is the density.

    ``means: (K, d)``; ``stds`` a scalar, one per component ``(K,)``, or ``(K, d)`` (positive);
    ``weights: (K,)`` positive (normalised here), uniform by default.
    """

    op = "gaussian_mixture"
    params = (
        tensor("means", ("K", "d"), lambda d, g: 2 * torch.randn(_SAMPLE_COMPONENTS, d, generator=g, dtype=torch.float64)),
        tensor(
            "stds",
            ("K", "d"),
            lambda d, g: 0.5 + torch.rand(_SAMPLE_COMPONENTS, d, generator=g, dtype=torch.float64),
            positive=True,
        ),
        tensor(
            "log_weights",
            ("K",),
            lambda d, g: torch.log_softmax(torch.randn(_SAMPLE_COMPONENTS, generator=g, dtype=torch.float64), 0),
            doc="normalised log mixture weights",
        ),
    )
    sample_scale = 2.0

    def __init__(
        self,
        means: Any,
        stds: Any = 1.0,
        weights: Any = None,
        *,
        dtype: torch.dtype | None = None,
        device: Any = None,
        backend: str | None = None,
    ) -> None:
        means_t = parameter_tensor(means, "means", dtype, device)
        if means_t.dim() != 2:
            raise InputError(f"GaussianMixtureEnergy: means must have shape (K, d), got {tuple(means_t.shape)}.")
        k, d = means_t.shape
        super().__init__(d, backend)
        stds_t = parameter_tensor(stds, "stds", means_t.dtype, device)
        if stds_t.dim() == 1 and stds_t.shape[0] == k:
            stds_t = stds_t[:, None]  # one std per component
        elif stds_t.dim() != 0 and tuple(stds_t.shape) != (k, d):
            raise InputError(
                f"GaussianMixtureEnergy: stds must be a scalar, one per component (K,) = ({k},), or (K, d) = ({k}, {d}); "
                f"got {tuple(stds_t.shape)}. For per-dimension stds shared by all components, pass stds.expand({k}, {d})."
            )
        if not bool((stds_t > 0).all()):
            raise InputError("GaussianMixtureEnergy: stds must be positive.")
        weights_t = (
            torch.ones(k, dtype=means_t.dtype, device=device)
            if weights is None
            else parameter_tensor(weights, "weights", means_t.dtype, device)
        )
        if weights_t.shape != (k,) or not bool((weights_t > 0).all()):
            raise InputError(f"GaussianMixtureEnergy: weights must be {k} positive numbers, got {weights_t.tolist()}.")
        log_weights = torch.log(weights_t / weights_t.sum())
        self.set_parameters(means=means_t, stds=stds_t.expand(k, d).contiguous(), log_weights=log_weights)

    @staticmethod
    def reference_energy(x: Tensor, means: Tensor, stds: Tensor, log_weights: Tensor) -> Tensor:
        """``-log sum_k w_k N(x; m_k, diag(s_k^2))``; ``x: (n, d)``, ``means, stds: (K, d)``, ``log_weights: (K,)``
        normalised -> ``(n,)``."""
        log_comp, _ = _mixture_log_components(x, means, stds, log_weights)
        return -torch.logsumexp(log_comp, dim=1)

    @staticmethod
    def reference_gradient(x: Tensor, means: Tensor, stds: Tensor, log_weights: Tensor) -> Tensor:
        """``sum_k r_k(x) (x - m_k) / s_k^2`` with responsibilities ``r_k``: ``(n, d)``."""
        log_comp, z = _mixture_log_components(x, means, stds, log_weights)
        resp = torch.softmax(log_comp, dim=1)
        return torch.einsum("nk,nkd->nd", resp, z / stds)
