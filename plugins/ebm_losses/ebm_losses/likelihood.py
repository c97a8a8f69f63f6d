"""What a held-out log-likelihood means: baselines on the same data, and cross-checks between estimates.

The baselines are scored on the same held-out points, on the same scale, as the model: the uniform density on
the data's box, and a diagonal and a full-covariance Gaussian fitted (maximum likelihood) to the training split.
Each comes with its standard error over the held-out points. :func:`compare` tells whether two estimates of
one quantity agree within their errors; when they do not, it warns (:class:`EstimatesDisagreeWarning`) and
returns a record for ``metrics.json``.

Discrete data (pixels on ``K`` levels) are scored dequantised, the standard protocol for likelihoods of discrete
images: each level is the centre of a bin of width ``δ`` on the model's scale (``δ = 2/K`` on ``[−1, 1]``), and a
held-out point is its level plus ``U(−δ/2, δ/2)`` per coordinate (:func:`dequantise`; the pixel plus ``U(0, 1)``,
mapped onto ``[−1, 1]``). The mean ``log p`` of such points, plus ``D·log δ``, is a lower bound on the discrete
log-likelihood of the levels (Jensen), whence :func:`bits_per_dim`. :func:`chosen_baselines` fits the baselines on
dequantised training data with their ridge chosen on a validation split, :func:`margins` pairs them with the model
point by point, and :func:`importance_log_z` is a second estimate of ``log Z`` against which AIS is checked.
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
    "dequantise",
    "bits_per_dim",
    "chosen_baselines",
    "margins",
    "importance_log_z",
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


def dequantise(x: Tensor, step: float, generator: torch.Generator) -> Tensor:
    """``x + (u − ½)·step``, ``u ~ U(0, 1)`` per coordinate: each grid value spread uniformly over its bin of width
    ``step`` (on the model's scale: ``2/K`` for ``K`` levels on ``[−1, 1]``). ``x: (n, *event_shape)``, same shape."""
    if not (isinstance(step, (int, float)) and math.isfinite(step) and step > 0):
        raise InputError(f"dequantise: step must be a finite number > 0 (the grid's step on the model's scale), got {step!r}.")
    u = torch.rand(x.shape, generator=generator, dtype=x.dtype, device=x.device)
    return x + (u - 0.5) * step


def bits_per_dim(log_likelihood: float, dim: int, step: float) -> float:
    """``bpd = −(log p + D·log δ) / (D·ln 2)``: the mean held-out ``log p`` (nats per example) of dequantised points on
    the model's scale, with ``D = dim`` coordinates and bins of width ``δ = step``, turned into bits per coordinate on
    the levels' own scale (bins of width 1, ``[0, K)``): ``−log p`` there divided by ``D·ln 2``, an upper bound on the
    discrete data's negative log-likelihood in bits. The uniform density gives ``log₂ K``."""
    return -(log_likelihood + dim * math.log(step)) / (dim * math.log(2))


def _fit_gaussian(x: Tensor, diagonal: bool, ridge: float) -> tuple[Tensor, Tensor] | None:
    """``(mean: (d,), L: (d, d))`` of the Gaussian fitted to ``x: (n, d)`` with ``ridge`` on the variances (``L``
    diagonal with ``diagonal``); None when the covariance is singular."""
    mean = x.mean(0)
    centred = x - mean
    if diagonal:
        var = centred.square().mean(0) + ridge
        return (mean, torch.diag(var.sqrt())) if bool((var > 0).all()) else None
    cov = centred.T @ centred / x.shape[0] + ridge * torch.eye(x.shape[1], dtype=x.dtype, device=x.device)
    chol, info = torch.linalg.cholesky_ex(cov)
    return (mean, chol) if int(info) == 0 else None


def _gaussian_log_density(fit: tuple[Tensor, Tensor], x: Tensor) -> Tensor:
    """``log N(x; mean, LLᵀ)`` per point: ``x: (n, d) -> (n,)``."""
    mean, chol = fit
    z = torch.linalg.solve_triangular(chol, (x - mean).T, upper=False)
    return -0.5 * z.square().sum(0) - chol.diagonal().log().sum() - 0.5 * x.shape[1] * math.log(2 * math.pi)


RIDGE_FACTORS = (0.0, 0.03, 0.1, 0.3, 1.0, 3.0)
"""The ridges :func:`chosen_baselines` tries, in units of ``δ²/12`` (the variance one bin's dequantisation adds)."""
MIXTURE_COMPONENTS = (1, 2, 5, 10)
"""The numbers of components of the Gaussian mixture baseline it tries (full covariance)."""


def _mixture(fit_x: Tensor, seed: int, components: int, reg: float) -> Any:
    from sklearn.mixture import GaussianMixture

    return GaussianMixture(components, covariance_type="full", reg_covar=reg, random_state=seed, max_iter=200).fit(
        fit_x.cpu().numpy()
    )


def chosen_baselines(
    train: Tensor,
    test: Tensor,
    box: tuple[float, float],
    *,
    step: float,
    seed: int = 0,
    validation_fraction: float = 0.2,
    ridge_factors: tuple[float, ...] = RIDGE_FACTORS,
    components: tuple[int, ...] = MIXTURE_COMPONENTS,
) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """The baselines of dequantised data: ``uniform`` on ``box``, ``diagonal_gaussian``, ``gaussian`` (full
    covariance) and ``gaussian_mixture`` (scikit-learn's, full covariance), fitted to ``train: (n, *event_shape)``
    (already dequantised), each with its ridge (``reg_covar`` and number of components for the mixture) chosen on a
    validation split of ``validation_fraction`` of ``train`` (shuffled with ``seed``) among ``ridge_factors·δ²/12``
    (``δ = step``), then refitted on all of ``train`` and scored on ``test``. Returns the report (per baseline:
    ``log_likelihood`` and ``standard_error`` in nats per example, ``bits_per_dim``, the chosen ``ridge``, the
    ``validation`` log-likelihood of each candidate) and each baseline's held-out ``log p`` per point ``(m,)``."""
    x, y = _flat(train, "train"), _flat(test, "test")
    if x.shape[1] != y.shape[1]:
        raise InputError(f"train and test differ in event size: {x.shape[1]} and {y.shape[1]}.")
    if not 0 < validation_fraction < 1 or x.shape[0] < 10:
        raise InputError(
            f"chosen_baselines needs validation_fraction in (0, 1) and at least 10 training points, got "
            f"{validation_fraction} and {x.shape[0]}."
        )
    d, unit = x.shape[1], step * step / 12
    order = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(seed)).to(x.device)
    n_val = max(1, int(round(validation_fraction * x.shape[0])))
    val, fit = x[order[:n_val]], x[order[n_val:]]
    report: dict[str, Any] = {"uniform": uniform_log_likelihood(test, *box)}
    uniform = report["uniform"]
    per_point: dict[str, Tensor] = {}
    if uniform["log_likelihood"] is not None:
        uniform["bits_per_dim"] = bits_per_dim(uniform["log_likelihood"], d, step)
        per_point["uniform"] = torch.full((y.shape[0],), uniform["log_likelihood"], dtype=y.dtype)
    for key, diagonal in (("diagonal_gaussian", True), ("gaussian", False)):
        scores = {}
        for factor in ridge_factors:
            trial = _fit_gaussian(fit, diagonal, factor * unit)
            scores[factor * unit] = float(_gaussian_log_density(trial, val).mean()) if trial is not None else -math.inf
        ridge = max(scores, key=scores.get)
        final = _fit_gaussian(x, diagonal, ridge)
        if final is None:
            raise InputError(f"{key}: the training data's covariance is singular for every ridge tried; give larger ridges.")
        per_point[key] = _gaussian_log_density(final, y)
        report[key] = _scored(per_point[key], d, step) | {"ridge": ridge, "validation": _listed(scores)}
    try:
        scores = {}
        for k in [c for c in components if c <= fit.shape[0] // 2]:
            for factor in [f for f in ridge_factors if f > 0]:
                model = _mixture(fit, seed, k, factor * unit)
                scores[(k, factor * unit)] = float(model.score_samples(val.cpu().numpy()).mean())
        k, reg = max(scores, key=scores.get)
        model = _mixture(x, seed, k, reg)
        per_point["gaussian_mixture"] = torch.as_tensor(model.score_samples(y.cpu().numpy()), dtype=y.dtype)
        report["gaussian_mixture"] = _scored(per_point["gaussian_mixture"], d, step) | {
            "components": k,
            "ridge": reg,
            "validation": [{"components": c, "ridge": r, "log_likelihood": v} for (c, r), v in scores.items()],
        }
    except ImportError as exc:
        report["gaussian_mixture"] = {"skipped": f"{exc}; pip install scikit-learn (or 'ebm-losses[images]')"}
    for entry in report.values():
        entry.setdefault("validation_split", n_val)
    return report, per_point


def _scored(per_point: Tensor, d: int, step: float) -> dict[str, Any]:
    value, se = _mean_and_se(per_point)
    return {"log_likelihood": value, "standard_error": se, "bits_per_dim": bits_per_dim(value, d, step)}


def _listed(scores: dict[float, float]) -> list[dict[str, float]]:
    return [{"ridge": r, "log_likelihood": v} for r, v in scores.items()]


def margins(model: Tensor, log_z_se: float, baselines: dict[str, Tensor]) -> dict[str, dict[str, float]]:
    """The model's held-out margin over each baseline: ``model: (m,)`` its ``log p`` per held-out point, paired with
    each baseline's ``(m,)``; ``margin`` is the mean difference (nats per example) and ``standard_error`` combines the
    paired differences' ``std/√m`` with ``log_z_se``, the error of the model's ``log Z`` (common to every point)."""
    out = {}
    for name, values in baselines.items():
        mean, se = _mean_and_se(model.double() - values.double().to(model.device))
        out[name] = {"margin": mean, "standard_error": math.hypot(se, log_z_se)}
    return out


def importance_log_z(
    energy: Any,
    loc: Tensor,
    scale_tril: Tensor,
    *,
    event_shape: tuple[int, ...],
    n: int = 4096,
    seed: int = 0,
    bounds: tuple[float, float] | None = None,
    base: Any = None,
    chunk: int = 1024,
) -> dict[str, Any]:
    """``log Z = log mean_i exp(−E(x_i) − log q(x_i))``, ``x_i ~ q = N(loc, LLᵀ)`` (``loc: (d,)``, ``scale_tril: (d,
    d)``, ``d = prod(event_shape)``): simple importance sampling, a second estimate of the normaliser independent of
    AIS's annealing. With ``base`` (an :class:`ebm_samplers.ais.ExactBase` in the whitened coordinates
    ``z = L⁻¹(x − loc)``, such as a fitted mixture) ``q`` is that base mapped to ``x``: ``x = loc + Lz``,
    ``log q(x) = −E₀(z) − log Z₀ − log|det L|``. With ``bounds = (low, high)`` the normaliser is that of ``exp(−E)`` restricted to the box
    ``[low, high]^d`` (points of ``q`` outside weigh 0). Returns ``log_z``, its delta-method ``standard_error``,
    ``effective_sample_size`` ``(Σw)²/Σw²`` of ``n`` (``log_z`` None when no weight is finite); the standard error is itself unreliable when
    the effective sample size is a small fraction of ``n``."""
    if not (isinstance(n, int) and n >= 2):
        raise InputError(f"importance_log_z: n must be an integer >= 2, got {n!r}.")
    d = math.prod(event_shape)
    if loc.shape != (d,) or scale_tril.shape != (d, d):
        raise InputError(
            f"importance_log_z: loc must be ({d},) and scale_tril ({d}, {d}), got {tuple(loc.shape)} and {tuple(scale_tril.shape)}."
        )
    g = torch.Generator(device=loc.device).manual_seed(seed)
    chol, mean = scale_tril.double(), loc.double()
    dtype = next((p.dtype for p in energy.parameters()), torch.float32) if hasattr(energy, "parameters") else torch.float32
    log_det = float(chol.diagonal().log().sum())
    logs = []
    with torch.no_grad():
        for size in [chunk] * (n // chunk) + ([n % chunk] if n % chunk else []):
            if base is None:
                z = torch.randn(size, d, generator=g, dtype=torch.float64, device=loc.device)
                log_q = -0.5 * z.square().sum(1) - log_det - 0.5 * d * math.log(2 * math.pi)
            else:
                drawn = base.sample(size, g)
                log_q = -base.energy(drawn).double() - base.log_z - log_det
                z = drawn.double()
            x = mean + z @ chol.T
            e = energy.compute_energy(x.to(dtype).reshape(size, *event_shape)).double()
            log_w = -e - log_q
            if bounds is not None:
                log_w = log_w.masked_fill(((x < bounds[0]) | (x > bounds[1])).any(1), -math.inf)
            logs.append(log_w)
    log_w = torch.cat(logs)
    top = log_w.max()
    if not bool(torch.isfinite(top)):
        return {"log_z": None, "standard_error": None, "effective_sample_size": 0.0, "n": n}
    w = (log_w - top).exp()
    mean_w = w.mean()
    return {
        "log_z": float(top + mean_w.log()),
        "standard_error": float(w.std() / (mean_w * math.sqrt(n))),
        "effective_sample_size": float(w.sum().square() / w.square().sum()),
        "n": n,
    }
