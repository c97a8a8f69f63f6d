"""Draws and sampler statistics as ArviZ data: a ``posterior`` group (``x``) and a ``sample_stats`` group
with ArviZ's names (:mod:`ebm_samplers.draws`), laid out ``(chain, draw, ...)``.

Optional: ``pip install 'ebm-samplers[arviz]'`` (ArviZ and the h5netcdf backend). ArviZ 0.x gives an
``arviz.InferenceData``; ArviZ 1.x (``arviz_base``, Python >= 3.12) an ``xarray.DataTree``. Both write the same
netCDF file, which ``arviz.from_netcdf`` (0.x) and ``xarray.open_datatree`` (1.x) read.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import ebmcore
from ebmcore.errors import MissingDependencyError, RunFileError
from ebmcore.recording import SampleResult
from ebmcore.runfiles import as_numpy, write_bytes

from ebm_samplers import draws as draws_module
from ebm_samplers.draws import Draws

__all__ = ["unavailable", "to_arviz", "write_netcdf"]

_INSTALL = "pip install 'ebm-samplers[arviz]'"


def _library() -> Any:
    """ArviZ's converters: ``arviz`` 0.x (InferenceData), else ``arviz_base`` (ArviZ >= 1, DataTree); None if neither."""
    try:
        arviz = importlib.import_module("arviz")
        if int(arviz.__version__.split(".")[0]) < 1:
            return arviz
    except ImportError:
        pass
    try:
        return importlib.import_module("arviz_base")
    except ImportError:
        return None


def unavailable() -> str | None:
    """Why draws cannot be converted to ArviZ or written as netCDF here, or None."""
    if _library() is None:
        return f"ArviZ is not installed ({_INSTALL})"
    try:
        importlib.import_module("h5netcdf")
    except ImportError:
        return f"no netCDF backend: h5netcdf is not installed ({_INSTALL})"
    return None


def to_arviz(result: Draws | SampleResult, sampler: Any = None, **tunables: Any) -> Any:
    """``result`` (:class:`~ebm_samplers.draws.Draws`, or a ``SampleResult`` sampled with ``return_trajectory=True``
    and, for ``sample_stats``, ``return_stats=True``) as ArviZ data. With ``sampler`` (and the ``tunables`` the run
    used) the step size, and HMC's leapfrog steps, are added per chain."""
    library = _library()
    if library is None:
        raise MissingDependencyError(f"converting draws to ArviZ needs ArviZ: {_INSTALL}.")
    if isinstance(result, SampleResult):
        per_chain = draws_module.params_stats(sampler, result.samples, tunables) if sampler is not None else None
        name = type(sampler).__name__ if sampler is not None else None
        metric_name, metric = draws_module.metric_arrays(sampler, result.samples, tunables) if sampler is not None else (None, {})
        attrs = {**({"sampler": name} if name else {}), **({"metric": metric_name} if metric_name else {})}
        result = draws_module.from_result(result.trajectory, result.stats, per_chain, attrs, metric)
    posterior = {"x": _chain_major(result.x)}
    stats = {name: _chain_major(value) for name, value in result.stats.items()}
    attrs = {
        "inference_library": "ebm",
        "inference_library_version": ebmcore.__version__,
        **{k: str(v) for k, v in result.attrs.items()},
    }
    metric = _metric_dataset(result.metric)
    if library.__name__ == "arviz":  # 0.x: keyword groups, attributes of the InferenceData
        data = library.from_dict(posterior=posterior, sample_stats=stats or None, attrs=attrs)
        if metric is not None:
            data.add_groups(metric=metric)
        return data
    groups = {"posterior": posterior, **({"sample_stats": stats} if stats else {})}
    tree = library.from_dict(groups, attrs={group: attrs for group in groups})
    if metric is not None:
        tree["metric"] = metric
    return tree


def _metric_dataset(metric: dict[str, Any]) -> Any:
    """The metric's arrays (``metric_<key>``, no chain or draw axis) as an ``xarray.Dataset`` named ``<key>``; None if none."""
    if not metric:
        return None
    import xarray

    return xarray.Dataset(
        {
            name.removeprefix(draws_module.METRIC_PREFIX): ([f"{name}_dim_{i}" for i in range(value.dim())], as_numpy(value))
            for name, value in metric.items()
        }
    )


def _chain_major(value: Any) -> Any:
    """``(n_draws, n_chains, ...)`` tensor -> ArviZ's ``(chain, draw, ...)`` numpy array."""
    return as_numpy(value.transpose(0, 1))


def write_netcdf(result: Draws | SampleResult, path: Path, sampler: Any = None, **tunables: Any) -> None:
    """:func:`to_arviz` of ``result`` written to ``path`` (netCDF-4 through h5netcdf), atomically."""
    why_not = unavailable()
    if why_not is not None:
        raise MissingDependencyError(f"writing netCDF draws: {why_not}.")
    data = to_arviz(result, sampler, **tunables)
    tmp = path.with_name(path.name + ".tmp")
    try:  # h5netcdf writes to a file: that file's bytes then go to path as every run file does (fsync, rename)
        data.to_netcdf(str(tmp), engine="h5netcdf")
        write_bytes(path, tmp.read_bytes())
    except OSError as exc:
        raise RunFileError(f"cannot write {path}: {exc}; free some space or choose another run directory (--out).") from None
    finally:
        tmp.unlink(missing_ok=True)
