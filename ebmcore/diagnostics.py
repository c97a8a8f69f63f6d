"""MCMC convergence diagnostics for trajectories ``x: (n_draws, n_chains, *event_shape)``.

R-hat, effective sample size, autocorrelation, E-BFMI, acceptance and divergence counts,
vectorised over chains and event elements on any device. R-hat and ESS follow Vehtari,
Gelman, Simpson, Carpenter and Bürkner (2021), "Rank-normalization, folding, and
localization: an improved R-hat", and reproduce ArviZ's ``rhat``, ``ess`` and ``bfmi``
step by step (split chains, Blom's rank offset 3/8, Geyer's initial monotone sequence,
the ``n·log10(n)`` cap). Statistics are computed in float64; results come back on the
input's device, in its dtype for float32/float64 and as float32 for float16/bfloat16
(an ESS can overflow float16). Memory is bounded: the statistics run over blocks of event elements
and, within a block, chunks of chains (:data:`CHUNK_VALUES`), so a trajectory costs little more than
itself; the results do not depend on the chunk size.

Public API::

    rhat = split_rhat(x)                  # event_shape; worry above 1.01
    n_eff = ess_bulk(x), ess_tail(x)      # event_shape; worry below 100 per chain
    rho = autocorrelation(x, max_lag=50)  # (51, n_chains, *event_shape)
    bfmi = ebfmi(energy)                  # (n_chains,); worry below 0.3
    table = summary(x)                    # mean, sd, ess_bulk, ess_tail, r_hat
"""

from __future__ import annotations

import math
import operator
from typing import Any, Callable, Iterator

import torch
from torch import Tensor

from ebmcore.errors import InputError

__all__ = [
    "autocorrelation",
    "split_rhat",
    "ess_bulk",
    "ess_tail",
    "ess_mean",
    "ebfmi",
    "acceptance_rate",
    "divergences",
    "summary",
]

CHUNK_VALUES = 1 << 16
"""How many draws the statistics hold at once: a block of event elements with all their draws (a whole
element at least, since ranks pool every chain), and chunks of chains within it (for the FFTs). Memory grows
with this, not with the trajectory: about 100 bytes per value of a block."""

_LAYOUT = "(n_draws, n_chains, *event_shape)"
_MIN_DRAWS = 4
_RESOLUTION = 1e-15  # numpy.finfo(float).resolution: ArviZ's test for a constant input to ESS
_BLOM = 3.0 / 8.0  # fractional offset of the rank → normal-score transform (Blom 1958)


# --- input checks ------------------------------------------------------------------------------


def _check_draws(x: Any, fn: str, name: str = "x", layout: str = _LAYOUT, exact_dim: int | None = None) -> Tensor:
    """A finite floating tensor of shape ``layout`` with at least 4 draws and 1 chain (one host sync)."""
    if not isinstance(x, Tensor):
        raise InputError(
            f"{fn}: {name} must be a torch.Tensor of shape {layout}, got {type(x).__name__}; "
            f"wrap it with torch.as_tensor({name})."
        )
    if x.is_meta:
        raise InputError(f"{fn}: {name} is on the meta device, which holds no values; pass the draws on a real device.")
    if not x.is_floating_point():
        raise InputError(
            f"{fn}: {name} has dtype {x.dtype}; diagnostics need floating-point draws. Use {name}.double() (or {name}.float())."
        )
    if x.dim() < 2 or (exact_dim is not None and x.dim() != exact_dim):
        hint = f" For a single chain use {name}.unsqueeze(1)." if x.dim() == 1 else ""
        raise InputError(f"{fn}: {name} must have shape {layout}, got {tuple(x.shape)}.{hint}")
    n_draws, n_chains = x.shape[0], x.shape[1]
    if n_draws < _MIN_DRAWS:
        hint = (
            f" Draws are the first dimension: if {name} is laid out (n_chains, n_draws), pass {name}.transpose(0, 1)."
            if n_chains >= _MIN_DRAWS
            else ""
        )
        raise InputError(
            f"{fn}: {name} has {n_draws} draws per chain (shape {tuple(x.shape)}); at least "
            f"{_MIN_DRAWS} are needed. Run the sampler for more steps.{hint}"
        )
    if n_chains < 1:
        raise InputError(f"{fn}: {name} has no chains (shape {tuple(x.shape)}); at least 1 is needed.")
    rows = max(1, CHUNK_VALUES // max(1, x[0].numel()))
    finite = [torch.isfinite(x[i : i + rows]).all() for i in range(0, n_draws, rows)]
    if not bool(torch.stack(finite).all()):  # one host sync, and no mask the size of the trajectory
        bad = ~torch.isfinite(x)
        first = tuple(bad.nonzero()[0].tolist())
        chains = bad.flatten(2).any(-1).any(0) if x.dim() > 2 else bad.any(0)
        raise InputError(
            f"{fn}: {name} has {int(bad.sum())} non-finite values (NaN or inf), first at "
            f"{name}[{', '.join(map(str, first))}], in chains {chains.nonzero().flatten()[:10].tolist()}. "
            f"Drop diverged chains before diagnosing, e.g. {name}[:, keep] with keep = "
            f"torch.isfinite({name}).reshape({n_draws}, {n_chains}, -1).all(-1).all(0), "
            "or fix the sampler."
        )
    return x


def _check_steps(x: Any, fn: str, name: str, kinds: str, binary: bool) -> Tensor:
    """A ``(n_draws, n_chains)`` bool or real tensor in [0, 1] (exactly 0 or 1 if ``binary``); one host sync."""
    if not isinstance(x, Tensor):
        raise InputError(
            f"{fn}: {name} must be a torch.Tensor of shape (n_draws, n_chains), got "
            f"{type(x).__name__}; wrap it with torch.as_tensor({name})."
        )
    if x.dim() != 2:
        hint = f" For a single chain use {name}.unsqueeze(1)." if x.dim() == 1 else ""
        raise InputError(f"{fn}: {name} must have shape (n_draws, n_chains), got {tuple(x.shape)}.{hint}")
    if x.shape[0] < 1 or x.shape[1] < 1:
        raise InputError(f"{fn}: {name} has shape {tuple(x.shape)}; at least 1 draw and 1 chain are needed.")
    if x.is_meta:
        raise InputError(f"{fn}: {name} is on the meta device, which holds no values; pass them on a real device.")
    if x.dtype == torch.bool:
        return x
    if x.is_complex():
        raise InputError(f"{fn}: {name} has dtype {x.dtype}; pass {kinds}.")
    inside = (x == 0) | (x == 1) if binary else (x >= 0) & (x <= 1)
    if not bool(inside.all()):
        raise InputError(
            f"{fn}: {name} must hold {'0 or 1' if binary else 'values in [0, 1]'}; "
            f"{int((~inside).sum())} entries do not (NaN counts as outside). Pass {kinds}."
        )
    return x


# --- float64 building blocks on (n, m, k): n draws, m chains, k event elements ------------------


def _out_dtype(x: Tensor) -> torch.dtype:
    return torch.promote_types(x.dtype, torch.float32)


def _float64(x: Tensor) -> Tensor:
    """``x`` in float64; on a device without float64 (Apple MPS) the statistics run on the CPU."""
    return x.to(device="cpu" if x.device.type == "mps" else x.device, dtype=torch.float64)


def _blocks(x: Tensor) -> Iterator[Tensor]:
    """``x: (n, m, *event)`` as views ``(n, m, k)`` of consecutive event elements, of at most :data:`CHUNK_VALUES`
    values each (one element, where its draws alone are more)."""
    n, m = x.shape[0], x.shape[1]
    flat = x.reshape(n, m, math.prod(x.shape[2:]))
    k = max(1, CHUNK_VALUES // (n * m))
    for j in range(0, flat.shape[2], k):
        yield flat[:, :, j : j + k]


def _chains(z: Tensor) -> Iterator[Tensor]:
    """``z: (n, m, k)`` in chunks of whole chains, of at most :data:`CHUNK_VALUES` values each (one chain at least)."""
    step = max(1, CHUNK_VALUES // max(1, z.shape[0] * z.shape[2]))
    for c in range(0, z.shape[1], step):
        yield z[:, c : c + step]


def _per_element(x: Tensor, keys: tuple[str, ...], prob: float = 0.1) -> dict[str, Tensor]:
    """:func:`_statistics` ``keys`` of ``x: (n, m, *event)``, block of elements by block; each has ``event_shape``."""
    # written into tensors made first: small results kept between blocks would fragment the heap the blocks reuse
    out = {key: torch.empty(x.shape[2:], dtype=_out_dtype(x), device=x.device) for key in keys}
    j = 0
    for block in _blocks(x):
        for key, value in _statistics(_float64(block), frozenset(keys), prob).items():
            out[key].view(-1)[j : j + block.shape[2]] = value
        j += block.shape[2]
    return out


def _split(z: Tensor) -> Tensor:
    """Halve every chain: ``(n, m, k)`` -> ``(n // 2, 2m, k)``; the middle draw of an odd ``n`` is dropped."""
    n = z.shape[0]
    half = n // 2
    return torch.cat([z[:half], z[n - half :]], dim=1)


def _halves(z: Tensor) -> Tensor:
    """The draws that the split chains hold: ``z`` without the middle draw of an odd ``n``."""
    n = z.shape[0]
    return z if n % 2 == 0 else torch.cat([z[: n // 2], z[n - n // 2 :]])


def _sorted_pooled(z: Tensor) -> Tensor:
    """``(n, m, k)`` -> ``(k, n·m)``: every element's draws of all chains, sorted."""
    n, m, k = z.shape
    return z.reshape(n * m, k).T.contiguous().sort(dim=-1).values


def _normal_scores(z: Tensor) -> tuple[Tensor, Tensor]:
    """Normal scores ``Φ⁻¹((r − 3/8) / (N + 1/4))`` of the ranks ``r`` pooled over draws and chains.

    Ties get their average rank (scipy's ``rankdata``). Returns the scores ``(n, m, k)`` and the
    sorted pooled values ``(k, N)``, which the median and the quantiles reuse.
    """
    n, m, p = z.shape
    size = n * m
    s, order = z.reshape(size, p).T.contiguous().sort(dim=-1)
    tied = s[:, 1:] == s[:, :-1]
    if bool(tied.any()):
        pos = torch.arange(size, device=z.device).expand(p, size)
        edge = torch.ones(p, 1, dtype=torch.bool, device=z.device)
        first = torch.where(torch.cat([edge, ~tied], 1), pos, 0).cummax(-1).values
        last = torch.where(torch.cat([~tied, edge], 1), pos, size).flip(-1).cummin(-1).values.flip(-1)
        del tied
        rank = first.add_(last).to(torch.float64).div_(2.0).add_(1.0)
        del first, last
        scores_sorted = torch.special.ndtri(rank.sub_(_BLOM).div_(size - 2 * _BLOM + 1), out=rank)
    else:  # no ties: every element's sorted scores are the same row
        del tied
        rank = torch.arange(1, size + 1, dtype=torch.float64, device=z.device)
        scores_sorted = torch.special.ndtri(rank.sub_(_BLOM).div_(size - 2 * _BLOM + 1), out=rank).expand(p, size)
    del rank
    scores = torch.empty(p, size, dtype=torch.float64, device=z.device).scatter_(-1, order, scores_sorted)
    return scores.T.reshape(n, m, p), s


def _median(s: Tensor) -> Tensor:
    """Median of sorted ``(k, N)`` rows, the mean of the two middle values for an even ``N`` (numpy's): ``(k,)``."""
    size = s.shape[-1]
    if size % 2:
        return s[:, size // 2]
    return (s[:, size // 2 - 1] + s[:, size // 2]) / 2.0


def _quantile(s: Tensor, prob: float) -> Tensor:
    """Type-7 quantile of sorted ``(k, N)`` rows (scipy's ``mquantiles(alphap=1, betap=1)``, as ArviZ): ``(k,)``."""
    size = s.shape[-1]
    aleph = size * prob + (1.0 - prob)
    k = int(math.floor(min(max(aleph, 1.0), size - 1.0)))
    gamma = min(max(aleph - k, 0.0), 1.0)
    return (1.0 - gamma) * s[:, k - 1] + gamma * s[:, k]


def _autocov(z: Tensor) -> Tensor:
    """Biased autocovariance of every chain at every lag, by FFT: ``(n, m, k)``."""
    n = z.shape[0]
    f = torch.fft.rfft(z - z.mean(0, keepdim=True), n=2 * n, dim=0)
    return torch.fft.irfft(f.real.square() + f.imag.square(), n=2 * n, dim=0)[:n] / n


class _SplitChains:
    """What R-hat and the ESS need of the split chains of draws ``(n, m, k)``, gathered chunk of chains by chunk
    (:meth:`add`): each half-chain's mean and variance ``(2m, k)``, the sum over half-chains of their power spectra
    ``(n // 2 + 1, k)`` (with ``spectra``) and the range of the draws, so memory does not grow with the chains."""

    def __init__(self, spectra: bool) -> None:
        self.spectra = spectra
        self.n = 0
        self.means: list[Tensor] = []
        self.variances: list[Tensor] = []
        self.power: Tensor | None = None
        self.low: Tensor | None = None
        self.high: Tensor | None = None

    @classmethod
    def of(cls, z: Tensor, spectra: bool, transform: Callable[[Tensor], Tensor] = lambda chunk: chunk) -> "_SplitChains":
        """The statistics of ``transform(chunk)`` over the chunks of chains of ``z``."""
        stats = cls(spectra)
        for chunk in _chains(z):
            stats.add(transform(chunk))
        return stats

    def add(self, chunk: Tensor) -> None:
        """Add the chains ``chunk: (n, c, k)`` (split here)."""
        z = _split(chunk)
        self.n = n = z.shape[0]
        mean = z.mean(0)
        self.means.append(mean)
        self.variances.append(z.var(0, correction=1))
        low, high = z.amin((0, 1)), z.amax((0, 1))
        self.low = low if self.low is None else torch.minimum(self.low, low)
        self.high = high if self.high is None else torch.maximum(self.high, high)
        if self.spectra:
            f = torch.fft.rfft(z - mean, n=2 * n, dim=0)
            power = (f.real.square() + f.imag.square()).sum(1)
            self.power = power if self.power is None else self.power.add_(power)

    def rhat(self) -> Tensor:
        """Gelman–Rubin potential scale reduction of the split chains: ``(k,)``."""
        n = self.n
        between = n * torch.cat(self.means).var(0, correction=1)
        within = torch.cat(self.variances).mean(0)
        return torch.sqrt((between / within + n - 1) / n)

    def ess(self) -> Tensor:
        """ESS of the split chains by Geyer's initial monotone sequence (ArviZ's ``_ess``): ``(k,)``.

        ArviZ walks the lags in pairs ``P_k = ρ_2k + ρ_2k+1`` until the first ``P_k ≤ 0`` (or
        ``2k − 1 ≥ n − 3``), keeps the running minimum of the pairs before it, and adds the
        even member of the last pair (clipped at 0 if the pair sum was negative). Here that walk
        is a cumulative minimum and a gather, so every element is done at once.
        """
        means = torch.cat(self.means)
        m, p = means.shape
        n = self.n
        total = n * m
        acov = torch.fft.irfft(self.power / m, n=2 * n, dim=0)[:n] / n  # (n, k): averaged over chains
        mean_var = acov[0] * n / (n - 1.0)
        var_plus = mean_var * (n - 1.0) / n
        if m > 1:
            var_plus = var_plus + means.var(0, correction=1)
        rho = 1.0 - (mean_var - acov) / var_plus  # (n, k)
        rho[0] = 1.0

        k_max = max((n - 3) // 2, 0)  # the last pair ArviZ's loop may reach
        pairs = rho[: 2 * (k_max + 1)].reshape(k_max + 1, 2, p).sum(1)
        nonpositive = pairs <= 0
        last = torch.where(nonpositive.any(0), nonpositive.to(torch.int8).argmax(0), k_max)  # (k,)
        monotone = torch.cummin(pairs, dim=0).values
        before_last = torch.arange(k_max + 1, device=means.device)[:, None] < last
        head = torch.where(before_last, monotone, torch.zeros_like(monotone)).sum(0)
        even = rho.gather(0, (2 * last)[None]).squeeze(0)
        last_pair = pairs.gather(0, last[None]).squeeze(0)
        even = torch.where(last_pair < 0, even.clamp_min(0.0), even)
        tau = (-1.0 + 2.0 * head + even).clamp_min(1.0 / math.log10(total))
        ess = total / tau
        constant = (self.high - self.low) < _RESOLUTION
        return torch.where(constant, torch.full_like(ess, float(total)), ess)


def _statistics(z: Tensor, want: frozenset[str], prob: float = 0.1) -> dict[str, Tensor]:
    """The statistics ``want`` of the float64 block ``z: (n, m, k)``, each ``(k,)``: ``mean``, ``sd``, ``r_hat``
    (rank-normalised: the larger of bulk and tail), ``r_hat_split`` (classic), ``ess_bulk``, ``ess_tail`` (of the
    ``prob/2`` and ``1 − prob/2`` quantiles) and ``ess_mean``. Each sort and spectrum is made once for all of them."""
    out: dict[str, Tensor] = {}
    if "mean" in want:
        out["mean"] = z.mean((0, 1))
    if "sd" in want:
        out["sd"] = z.std((0, 1), correction=1)
    if want & {"r_hat_split", "ess_mean"}:
        raw = _SplitChains.of(z, spectra="ess_mean" in want)
        if "r_hat_split" in want:
            out["r_hat_split"] = raw.rhat()
        if "ess_mean" in want:
            out["ess_mean"] = raw.ess()
    sorted_halves = None
    if want & {"r_hat", "ess_bulk"}:
        halves = _halves(z)
        scores, sorted_halves = _normal_scores(halves)
        bulk = _SplitChains.of(scores, spectra="ess_bulk" in want)
        del scores
        if "ess_bulk" in want:
            out["ess_bulk"] = bulk.ess()
        if "r_hat" in want:
            folded, _ = _normal_scores((halves - _median(sorted_halves)).abs_())
            tail, bulk_rhat = _SplitChains.of(folded, spectra=False).rhat(), bulk.rhat()
            # Python's max(bulk, tail), as ArviZ: an undefined (NaN) tail R-hat, all folded draws tied, is ignored
            out["r_hat"] = torch.where(tail > bulk_rhat, tail, bulk_rhat)
        del halves
    if "ess_tail" in want:
        # with an even number of draws the split chains hold every draw, so their sort serves the quantiles too
        s = sorted_halves if sorted_halves is not None and z.shape[0] % 2 == 0 else _sorted_pooled(z)
        lo, hi = _quantile(s, prob / 2), _quantile(s, 1 - prob / 2)
        indicators = lambda chunk: torch.cat([chunk <= lo, chunk <= hi], dim=-1).to(torch.float64)  # noqa: E731
        out["ess_tail"] = _SplitChains.of(z, spectra=True, transform=indicators).ess().reshape(2, -1).amin(0)
    return out


def _check_prob(prob: Any) -> float:
    try:
        p = float(prob)
    except (TypeError, ValueError):
        raise InputError(f"ess_tail: prob must be a number in (0, 1), got {prob!r}.") from None
    if not 0.0 < p < 1.0:
        raise InputError(
            f"ess_tail: prob is the mass of both tails together and must lie in (0, 1), got {prob!r}; "
            "the default 0.1 looks at the 5% and 95% quantiles."
        )
    return p


# --- public API --------------------------------------------------------------------------------


def autocorrelation(x: Tensor, max_lag: int | None = None) -> Tensor:
    """Per-chain autocorrelation by FFT: ``(n_draws, n_chains, *event)`` -> ``(n_lags, n_chains, *event)``.

    ``n_lags = max_lag + 1`` (default: every lag, ``n_draws``). Lag 0 is 1; the estimate at lag
    ``k`` is the biased autocovariance over the lag-0 one, as ``arviz.autocorr``. A chain whose
    draws are all equal has no autocorrelation: its values are NaN.
    """
    x = _check_draws(x, "autocorrelation")
    n = x.shape[0]
    lags = n - 1 if max_lag is None else max_lag
    try:
        lags = operator.index(lags) if not isinstance(lags, bool) else -1
    except TypeError:
        lags = -1
    if not 0 <= lags < n:
        raise InputError(f"autocorrelation: max_lag must be an integer in [0, {n - 1}] for {n} draws, got {max_lag!r}.")
    rho = torch.empty((lags + 1, *x.shape[1:]), dtype=_out_dtype(x), device=x.device)
    out = rho.view(lags + 1, x.shape[1], -1)
    j = 0
    for block in _blocks(x):  # per chain and element: any chunks will do
        c = 0
        for chunk in _chains(block):
            z = _float64(chunk)
            acov = _autocov(z)[: lags + 1]
            constant = z.amax(0) == z.amin(0)
            values = torch.where(constant, torch.full_like(acov, float("nan")), acov / acov[:1])
            out[:, c : c + z.shape[1], j : j + z.shape[2]] = values
            c += z.shape[1]
        j += block.shape[2]
    return rho


def split_rhat(x: Tensor, rank_normalize: bool = True) -> Tensor:
    """Split R-hat of draws ``(n_draws, n_chains, *event)`` -> ``event_shape``.

    ``rank_normalize=True`` (default): the rank-normalised split R-hat of Vehtari et al. (2021),
    the larger of the bulk R-hat (normal scores of the pooled ranks of the split chains) and the
    tail R-hat (the same on ``|x − median|``), as ``arviz.rhat(method="rank")``. ``False``: the
    classic split R-hat, ``arviz.rhat(method="split")``. Every chain is split in halves, so one
    chain is enough (ArviZ returns NaN there). An element that never changes gives NaN.
    """
    x = _check_draws(x, "split_rhat")
    key = "r_hat" if rank_normalize else "r_hat_split"
    return _per_element(x, (key,))[key]


def ess_bulk(x: Tensor) -> Tensor:
    """Bulk effective sample size of draws ``(n_draws, n_chains, *event)`` -> ``event_shape``.

    ESS of the normal scores of the ranks of the split chains (``arviz.ess(method="bulk")``):
    how many independent draws the centre of the distribution is worth.
    """
    x = _check_draws(x, "ess_bulk")
    return _per_element(x, ("ess_bulk",))["ess_bulk"]


def ess_tail(x: Tensor, prob: float = 0.1) -> Tensor:
    """Tail effective sample size of draws ``(n_draws, n_chains, *event)`` -> ``event_shape``.

    The smaller ESS of the indicators ``x ≤ q`` for the ``prob/2`` and ``1 − prob/2`` quantiles
    (default: 5% and 95%), i.e. ``arviz.ess(method="tail", prob=(prob/2, 1 - prob/2))``. Note that
    ``prob`` is the mass of both tails together, whereas ArviZ's scalar ``prob`` is the lower one.
    """
    x = _check_draws(x, "ess_tail")
    return _per_element(x, ("ess_tail",), _check_prob(prob))["ess_tail"]


def ess_mean(x: Tensor) -> Tensor:
    """Effective sample size for the mean, on the raw split chains: ``(n_draws, n_chains, *event)`` -> ``event_shape``.

    ``arviz.ess(method="mean")``; unlike the bulk ESS it assumes a finite variance.
    """
    x = _check_draws(x, "ess_mean")
    return _per_element(x, ("ess_mean",))["ess_mean"]


def ebfmi(energy: Tensor) -> Tensor:
    """E-BFMI of Hamiltonian energies ``(n_draws, n_chains)`` -> ``(n_chains,)``.

    ``Σ_t (E_t − E_{t−1})² / Σ_t (E_t − Ē)²`` per chain, as ``arviz.bfmi``: how well momentum
    resampling moves the chain through energy levels. Below 0.3 is poor; independent energies
    give about 2. A chain whose energy never changes gives NaN.
    """
    energy = _check_draws(energy, "ebfmi", name="energy", layout="(n_draws, n_chains)", exact_dim=2)
    e = _float64(energy)
    num = e.diff(dim=0).square().mean(0)
    den = e.var(0, correction=1)
    return (num / den).to(device=energy.device, dtype=_out_dtype(energy))


def acceptance_rate(accepted: Tensor) -> Tensor:
    """Mean over draws of ``accepted: (n_draws, n_chains)`` -> ``(n_chains,)``.

    ``accepted`` is bool (or 0/1), or acceptance probabilities in [0, 1]. Float input keeps its dtype
    (float16/bfloat16 come back as float32); bool and integers give the default dtype.
    """
    accepted = _check_steps(
        accepted,
        "acceptance_rate",
        "accepted",
        "a bool tensor (True = accepted) or acceptance probabilities in [0, 1]",
        binary=False,
    )
    out = _out_dtype(accepted) if accepted.is_floating_point() else torch.get_default_dtype()
    return accepted.to(torch.float64).mean(0).to(out)


def divergences(divergent: Tensor) -> Tensor:
    """Divergent transitions per chain: ``divergent: (n_draws, n_chains)`` bool (or 0/1) -> int64 ``(n_chains,)``."""
    divergent = _check_steps(divergent, "divergences", "divergent", "a bool tensor (True = divergent) or 0/1 values", binary=True)
    return divergent.to(torch.int64).sum(0)


def summary(x: Tensor) -> dict[str, Tensor]:
    """``mean``, ``sd`` (``ddof=1``), ``ess_bulk``, ``ess_tail`` and ``r_hat`` of draws ``(n_draws, n_chains, *event)``.

    Each value has ``event_shape``; the numbers are ArviZ ``summary``'s columns of the same names,
    except that ``r_hat`` is :func:`split_rhat`'s: with an odd number of draws ``az.summary`` folds
    around the median of all draws rather than of the split chains, and differs slightly.
    """
    x = _check_draws(x, "summary")
    return _per_element(x, ("mean", "sd", "ess_bulk", "ess_tail", "r_hat"))
