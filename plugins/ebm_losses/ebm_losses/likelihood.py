"""What a held-out log-likelihood means: baselines on the same data, and cross-checks between estimates.

The baselines are scored on the same held-out points, on the same scale, as the model: the uniform density on
the data's box, and a diagonal and a full-covariance Gaussian fitted (maximum likelihood) to the training split.
Each comes with its standard error over the held-out points. :func:`compare` tells whether two estimates of
one quantity agree within their errors; when they do not, it warns (:class:`EstimatesDisagreeWarning`) and
returns a record for ``metrics.json``.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch
from torch import Tensor

from ebmcore.errors import InputError

__all__ = [
    "EstimatesDisagreeWarning",
    "uniform_log_likelihood",
    "gaussian_log_likelihood",
    "quantum",
    "baselines",
    "compare",
    "DISAGREEMENT_Z",
    "DISAGREEMENT_ATOL",
]

DISAGREEMENT_Z = 3.0
"""Two estimates disagree when they are more than this many combined standard errors apart ..."""
DISAGREEMENT_ATOL = 1e-3
"""... and more than this many nats (rounding of float32 energies)."""


class EstimatesDisagreeWarning(UserWarning):
    """Two estimates of one quantity (e.g. a held-out log-likelihood by grid and by AIS) disagree beyond their errors."""


def _mean_and_se(values: Tensor) -> tuple[float, float]:
    """The mean of per-point values ``(n,)`` and its standard error ``std/√n`` (0 for one point)."""
    n = values.numel()
    return float(values.mean()), float(values.std() / math.sqrt(n)) if n > 1 else 0.0


def _flat(x: Tensor, name: str) -> Tensor:
    if not isinstance(x, Tensor) or x.dim() < 2 or x.shape[0] < 1:
        raise InputError(
            f"{name} must be a tensor of shape (n, *event_shape) with n >= 1, got "
            f"{tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__}."
        )
    return x.flatten(1).double()


def uniform_log_likelihood(test: Tensor, low: float, high: float) -> dict[str, Any]:
    """Mean held-out log-likelihood of the uniform density on the box ``[low, high]^d``: exactly ``−d·log(high − low)``
    for every point inside (standard error 0). ``test: (n, *event_shape)``. With points outside the box the mean is
    ``−inf``: ``log_likelihood`` is then None and ``n_outside`` counts them."""
    x = _flat(test, "test")
    if not high > low:
        raise InputError(f"the box needs high > low, got [{low}, {high}].")
    outside = int(((x < low) | (x > high)).any(1).sum())
    value = -x.shape[1] * math.log(high - low)
    return {
        "log_likelihood": None if outside else value,
        "standard_error": 0.0,
        "box": [float(low), float(high)],
        "dim": x.shape[1],
        "n_outside": outside,
    }


def gaussian_log_likelihood(train: Tensor, test: Tensor, *, diagonal: bool = False, ridge: float = 0.0) -> dict[str, Any]:
    """Mean held-out log-likelihood (and its standard error over ``test``) of the Gaussian fitted by maximum likelihood
    to ``train: (n, *event_shape)``: mean and covariance (``diagonal``: per-dimension variances) of the training
    points, plus ``ridge`` on the diagonal. ``test: (m, *event_shape)``."""
    x, y = _flat(train, "train"), _flat(test, "test")
    if x.shape[1] != y.shape[1]:
        raise InputError(f"train and test differ in event size: {x.shape[1]} and {y.shape[1]}.")
    if not (math.isfinite(ridge) and ridge >= 0):
        raise InputError(f"ridge must be a finite number >= 0, got {ridge!r}.")
    d = x.shape[1]
    mean = x.mean(0)
    centred, held = x - mean, y - mean
    if diagonal:
        var = centred.square().mean(0) + ridge
        if not bool((var > 0).all()):
            raise InputError(f"{int((var <= 0).sum())} coordinate(s) of the training data are constant: give a ridge > 0.")
        per_point = -0.5 * (held.square() / var).sum(1) - 0.5 * var.log().sum()
    else:
        cov = centred.T @ centred / x.shape[0] + ridge * torch.eye(d, dtype=x.dtype, device=x.device)
        chol, info = torch.linalg.cholesky_ex(cov)
        if int(info) != 0:
            raise InputError("the training data's covariance is singular (constant or collinear coordinates): give a ridge > 0.")
        z = torch.linalg.solve_triangular(chol, held.T, upper=False)
        per_point = -0.5 * z.square().sum(0) - chol.diagonal().log().sum()
    per_point = per_point - 0.5 * d * math.log(2 * math.pi)
    value, se = _mean_and_se(per_point)
    return {"log_likelihood": value, "standard_error": se, "ridge": float(ridge)}


def quantum(values: Tensor, max_values: int = 1 << 17) -> float | None:
    """The smallest gap between distinct values of ``values`` (the first ``max_values`` of them): the pixel step of
    quantised data (``2/16`` for the digits on ``[−1, 1]``), tiny for continuous data; None with one distinct value."""
    distinct = torch.unique(values.detach().flatten()[:max_values].double())
    if distinct.numel() < 2:
        return None
    return float((distinct[1:] - distinct[:-1]).min())


def baselines(train: Tensor, test: Tensor, box: tuple[float, float]) -> dict[str, Any]:
    """The held-out log-likelihoods (nats per example, with standard errors) of ``uniform`` on ``box`` (per
    coordinate), ``diagonal_gaussian`` and ``gaussian`` (full covariance) fitted to ``train``. The Gaussians get the
    ridge ``δ²/12``, ``δ`` = :func:`quantum` of the training data: the variance that dequantising by one step would
    add, which keeps the covariance of quantised data with constant pixels invertible (and is negligible for
    continuous data)."""
    step = quantum(train)
    ridge = step * step / 12 if step is not None else 1e-6
    return {
        "uniform": uniform_log_likelihood(test, *box),
        "diagonal_gaussian": gaussian_log_likelihood(train, test, diagonal=True, ridge=ridge),
        "gaussian": gaussian_log_likelihood(train, test, ridge=ridge),
    }


def compare(
    quantity: str,
    first: tuple[str, float, float],
    second: tuple[str, float, float],
    *,
    note: str = "",
    z: float = DISAGREEMENT_Z,
    atol: float = DISAGREEMENT_ATOL,
) -> dict[str, Any] | None:
    """Whether two estimates ``(name, value, standard_error)`` of ``quantity`` agree: None when
    ``|a − b| ≤ z·√(se_a² + se_b²) + atol``; else warn (:class:`EstimatesDisagreeWarning`) and return the record
    ``{"quantity", "estimates": {name: [value, se]}, "difference", "combined_error", "message"}``."""
    (name_a, a, se_a), (name_b, b, se_b) = first, second
    combined = math.hypot(se_a, se_b)
    difference = a - b
    if math.isfinite(difference) and abs(difference) <= z * combined + atol:
        return None
    apart = f"{abs(difference) / combined:.0f} combined standard errors" if combined > 0 else "with no error to explain it"
    message = (
        f"{quantity}: {name_a} gives {a:.3f} ± {se_a:.3f} and {name_b} {b:.3f} ± {se_b:.3f}, "
        f"{abs(difference):.3g} nats apart ({apart}); neither is reliable." + (f" {note}" if note else "")
    )
    warnings.warn(message, EstimatesDisagreeWarning, stacklevel=2)
    return {
        "quantity": quantity,
        "estimates": {name_a: [a, se_a], name_b: [b, se_b]},
        "difference": difference,
        "combined_error": combined,
        "message": message,
    }
