"""The kept draws of a run with their per-draw sampler statistics, under ArviZ's names, and the file
``ebm sample`` writes them to.

``draws.npz`` is plain numpy (``numpy.load(path)`` reads it without ebm, no pickle): ``x`` is the kept
trajectory ``(n_draws, n_chains, *event_shape)``, each statistic ``(n_draws, n_chains)``, and ``attrs`` a
JSON string (sampler, energy, ``thin``, ``seed``). The statistics, where the sampler has them (:data:`ARVIZ_NAMES`):

- ``lp``: ``−E(x)``, the unnormalised log density of the draw (every sampler);
- ``acceptance_rate``: the acceptance probability of the transition that made the draw;
- ``diverging``: that transition diverged;
- ``energy``: the Hamiltonian ``H`` (HMC, NUTS), what ``arviz.bfmi`` reads;
- ``tree_depth``, ``n_steps``: NUTS's tree depth and leapfrog steps; HMC's ``n_steps`` is its fixed
  ``n_leapfrog_steps``;
- ``step_size``: the step size the chain ran with (after warm-up).

HMC's and NUTS's metric (the inverse mass matrix ``M⁻¹`` the run used, after warm-up) is in ``attrs["metric"]``
(``"identity"``, ``"diag"``, ``"dense"`` or ``"low_rank"``) and, but for the identity, in arrays of its own
(:func:`metric_arrays`): ``metric_diagonal`` (``event_shape``, or ``(n_chains, *event_shape)`` per chain),
``metric_dense`` ``(d, d)``, or ``metric_diagonal``, ``metric_factors`` ``(d, k)`` and ``metric_eigenvalues`` ``(k,)``
(``M⁻¹ = diag(diagonal) + factors·diag(eigenvalues)·factorsᵀ``); ArviZ's netCDF holds them in a ``metric`` group.

A fused chain reports sums over the ``thin`` transitions since the previous draw: its statistics are their
means (``diverging``: whether any diverged), and it has no ``energy``.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch
from torch import Tensor

from ebmcore.errors import InputError, RunFileError
from ebmcore.runfiles import as_numpy, load_arrays, write_bytes

__all__ = ["ARVIZ_NAMES", "FORMATS", "Draws", "from_result", "params_stats", "metric_arrays", "save", "save_npz", "load_npz"]

ARVIZ_NAMES = {
    "acceptance": "acceptance_rate",
    "divergent": "diverging",
    "hamiltonian": "energy",
    "tree_depth": "tree_depth",
    "n_leapfrog_steps": "n_steps",
}
"""``SampleResult.stats`` names -> ArviZ's ``sample_stats`` names (``energy``, ``E(x)``, becomes ``lp = −E``)."""

LAYOUT = "x: (draw, chain, *event_shape); statistics: (draw, chain); draws.nc (ArviZ) holds (chain, draw, ...)"
"""The axes of ``draws.npz``, written into its ``attrs`` (``layout``): the trajectory's, as ``sample`` returns it;
ArviZ's netCDF puts the chain first."""


@dataclass(frozen=True)
class Draws:
    """``x: (n_draws, n_chains, *event_shape)`` and ``stats``: ArviZ-named ``(n_draws, n_chains)`` tensors;
    ``attrs``: plain values describing the run; ``metric``: the inverse mass matrix's arrays (:func:`metric_arrays`)."""

    x: Tensor
    stats: dict[str, Tensor]
    attrs: dict[str, Any] = field(default_factory=dict)
    metric: dict[str, Tensor] = field(default_factory=dict)


def params_stats(sampler: Any, x: Tensor, tunables: Mapping[str, Any] | None = None) -> dict[str, Tensor]:
    """``step_size`` (and ``n_steps`` for a fixed ``n_leapfrog_steps``) per chain ``(n_chains,)`` for states ``x``,
    from the params a run with ``tunables`` resolves to; empty for a sampler without such params."""
    resolve = getattr(sampler, "resolve", None)
    if resolve is None:
        return {}
    params = resolve(x, dict(tunables or {}))
    out = {}
    for name, arviz in (("step_size", "step_size"), ("n_leapfrog_steps", "n_steps")):
        value = getattr(params, name, None)
        if value is not None:
            out[arviz] = torch.as_tensor(value, device=x.device).expand(x.shape[0]).clone()
    return out


METRIC_PREFIX = "metric_"
"""The prefix of the metric's arrays in ``draws.npz`` (``metric_dense``, ...)."""


def metric_arrays(sampler: Any, x: Tensor, tunables: Mapping[str, Any] | None = None) -> tuple[str | None, dict[str, Tensor]]:
    """The metric a run with ``tunables`` resolves to for states ``x``: its name (``"identity"``, ``"diag"``, ``"dense"``,
    ``"low_rank"``; None for a sampler without one) and its arrays, named ``metric_<key>`` after
    :meth:`~ebm_samplers.InverseMass.tensors`."""
    resolve = getattr(sampler, "resolve", None)
    inv_mass = getattr(resolve(x, dict(tunables or {})), "inv_mass", None) if resolve is not None else None
    if inv_mass is None:
        return None, {}
    return inv_mass.metric, {METRIC_PREFIX + k: v for k, v in inv_mass.tensors().items()}


def from_result(
    trajectory: Tensor | None,
    stats: Mapping[str, Tensor] | None,
    per_chain: Mapping[str, Tensor] | None = None,
    attrs: Mapping[str, Any] | None = None,
    metric: Mapping[str, Tensor] | None = None,
) -> Draws:
    """The :class:`Draws` of a run: its ``trajectory`` and ``SampleResult.stats`` (renamed, ``lp = −energy``),
    with constant ``per_chain`` values (:func:`params_stats`) repeated over the draws where the run did not
    record them, and the ``metric``'s arrays (:func:`metric_arrays`)."""
    if trajectory is None:
        raise InputError("draws need the kept trajectory: sample with return_trajectory=True.")
    n_draws, n_chains = trajectory.shape[:2]
    out: dict[str, Tensor] = {}
    for name, value in (stats or {}).items():
        out["lp" if name == "energy" else ARVIZ_NAMES.get(name, name)] = -value if name == "energy" else value
    for name, value in (per_chain or {}).items():
        if value.shape != (n_chains,):
            raise InputError(f"per-chain value {name!r} must have shape (n_chains,) = ({n_chains},), got {tuple(value.shape)}.")
        out.setdefault(name, value.expand(n_draws, n_chains))
    for name, value in out.items():
        if value.shape != (n_draws, n_chains):
            raise InputError(
                f"statistic {name!r} must have shape (n_draws, n_chains) = ({n_draws}, {n_chains}), got {tuple(value.shape)}."
            )
    return Draws(trajectory, out, dict(attrs or {}), dict(metric or {}))


def save_npz(draws: Draws, path: Path) -> None:
    """Write ``draws`` to ``path`` (``.npz``) atomically (temporary name, fsync, rename)."""
    arrays = {name: as_numpy(value) for name, value in draws.stats.items()}
    buffer = io.BytesIO()
    attrs = {**draws.attrs, "layout": LAYOUT}
    arrays.update({name: as_numpy(value) for name, value in draws.metric.items()})
    np.savez(buffer, x=as_numpy(draws.x), attrs=np.array(json.dumps(attrs, default=str)), **arrays)
    write_bytes(path, buffer.getbuffer())


def load_npz(path: Path) -> Draws:
    """The :class:`Draws` of a ``draws.npz`` (tensors on the CPU); a file that is not one is a
    :class:`~ebmcore.errors.RunFileError` naming it."""
    fix = "write it with ebm sample (or draws.save_npz)"
    data = load_arrays(Path(path), keys=("x", "attrs"), what="the draws of ebm sample (x, attrs and statistics)", fix=fix)
    try:
        arrays = {name: torch.from_numpy(value) for name, value in data.items() if name not in ("x", "attrs")}
        stats = {name: value for name, value in arrays.items() if not name.startswith(METRIC_PREFIX)}
        metric = {name: value for name, value in arrays.items() if name.startswith(METRIC_PREFIX)}
        return Draws(torch.from_numpy(data["x"]), stats, json.loads(str(data["attrs"])), metric)
    except (TypeError, ValueError) as exc:  # a non-numeric array, attrs that are not JSON
        raise RunFileError(f"{path} does not hold ebm's draws ({type(exc).__name__}: {exc}); {fix}.") from None


FORMATS = {"npz": "draws.npz", "netcdf": "draws.nc", "none": None}
"""The draws file of each ``[output] draws`` format of ``ebm sample``."""


def save(directory: Path, fmt: str, draws: Draws) -> Path | None:
    """Write ``draws`` into ``directory`` in format ``fmt`` (:data:`FORMATS`); the path written, None for ``"none"``."""
    if fmt not in FORMATS:
        raise InputError(f"draws format must be one of {', '.join(FORMATS)}, got {fmt!r}.")
    name = FORMATS[fmt]
    if name is None:
        return None
    if fmt == "netcdf":
        from ebm_samplers.arviz_export import write_netcdf

        write_netcdf(draws, directory / name)
    else:
        save_npz(draws, directory / name)
    return directory / name
