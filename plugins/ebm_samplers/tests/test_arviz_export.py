"""ArviZ export: `ebm sample --format netcdf` writes a file ArviZ opens, whose R-hat, ESS and E-BFMI recomputed by
ArviZ are ebmcore.diagnostics's; a SampleResult converts with the (chain, draw) layout and ArviZ's names.

Each test runs once per ArviZ generation installed: ``arviz`` 0.x (InferenceData; what Python < 3.12 gets) and
``arviz_base``/``arviz_stats`` (ArviZ >= 1, DataTree). ``make setup`` installs ebm-samplers[arviz], so under CI a
missing ArviZ fails instead of skipping.
"""

import importlib
import json
import os

import numpy as np
import pytest
import torch

import ebmcore
from ebmcore import diagnostics
from ebmcore.cli import main
from ebm_samplers import NUTSSampler, arviz_export


def _installed(name):
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


_TAILS = {"bulk": None, "tail": (0.05, 0.95)}  # ebm's tail ESS: the 5% and 95% quantiles (ArviZ 1.x's default: 11%, 89%)


def _generation(kind):
    """``(converter module, open(path), rhat, ess(method), bfmi)`` of one ArviZ generation, or a skip."""
    if kind == "arviz":
        az = _installed("arviz")
        if az is None or int(az.__version__.split(".")[0]) >= 1:
            pytest.skip("ArviZ 0.x is not installed (pip install 'ebm-samplers[arviz]' on Python < 3.12)")
        return az, az.from_netcdf, az.rhat, lambda d, m: az.ess(d, method=m, prob=_TAILS[m]), az.bfmi
    azb, azs = _installed("arviz_base"), _installed("arviz_stats")
    if azb is None or azs is None:
        pytest.skip("arviz_base/arviz_stats (ArviZ >= 1, Python >= 3.12) are not installed")
    import xarray

    return azb, xarray.open_datatree, azs.rhat, lambda d, m: azs.ess(d, method=m, prob=_TAILS[m]), azs.bfmi


def _values(result, name="x"):
    """A variable of an ArviZ result (Dataset or DataTree) as numpy."""
    return np.asarray(result[name].values)


def test_ci_installs_arviz():
    if arviz_export.unavailable() is not None and not os.environ.get("CI"):
        pytest.skip(f"{arviz_export.unavailable()}: the ArviZ tests skip outside CI")
    assert arviz_export.unavailable() is None, "make setup installs ebm-samplers[arviz]"


CONFIG = """
[energy]
name = "gaussian_mixture"
params = { means = [[-1.0, 0.0], [1.0, 0.0]], stds = 0.8 }

[sampler]
name = "hmc"
params = { n_leapfrog_steps = 4, fused = false }
n_chains = 8
n_steps = 150
burn_in = 50
warmup = 50
target_accept = 0.8

[output]
plots = false
"""


@pytest.mark.parametrize("kind", ["arviz", "arviz_base"])
def test_sample_writes_netcdf_that_arviz_reads_with_the_same_diagnostics(tmp_path, capsys, monkeypatch, kind):
    library, open_netcdf, rhat, ess, bfmi = _generation(kind)
    monkeypatch.setattr(arviz_export, "_library", lambda: library)
    (tmp_path / "hmc.toml").write_text(CONFIG)
    out = tmp_path / "run"
    assert main(["sample", str(tmp_path / "hmc.toml"), "--out", str(out), "--format", "netcdf", "--quiet"]) == 0
    assert f"draws and sampler statistics: {out / 'draws.nc'}" in capsys.readouterr().out
    assert not (out / "draws.npz").exists()
    data = open_netcdf(str(out / "draws.nc"))
    stats = data["sample_stats"]
    assert set(stats.data_vars) == {"lp", "acceptance_rate", "diverging", "energy", "step_size", "n_steps"}
    assert _values(data["posterior"]).shape == (8, 150, 2) and _values(stats, "lp").shape == (8, 150)
    assert (_values(stats, "n_steps") == 4).all() and _values(stats, "diverging").dtype == bool
    # ArviZ's rank-normalised split R-hat, bulk and tail ESS, and E-BFMI equal ebmcore.diagnostics's
    draws = torch.from_numpy(_values(data["posterior"])).transpose(0, 1).double()  # ebm's (draw, chain, ...)
    # (R-hat to 2e-4 only: ArviZ ranks and folds float32 draws in float32, ebm in float64, and R-hat near 1 amplifies
    # the rounding (1e-6 to 1e-4 relative, with the draws); on float64 draws they agree to 1e-15)
    np.testing.assert_allclose(_values(rhat(data)), diagnostics.split_rhat(draws).numpy(), rtol=2e-4)
    np.testing.assert_allclose(_values(ess(data, "bulk")), diagnostics.ess_bulk(draws).numpy(), rtol=1e-9)
    np.testing.assert_allclose(_values(ess(data, "tail")), diagnostics.ess_tail(draws).numpy(), rtol=1e-9)
    hamiltonian = torch.from_numpy(_values(stats, "energy")).T.double()
    bfmi_values = bfmi(data)  # an array (0.x), a DataTree of the energy (1.x)
    bfmi_values = bfmi_values if isinstance(bfmi_values, np.ndarray) else _values(bfmi_values, "energy")
    np.testing.assert_allclose(bfmi_values, diagnostics.ebfmi(hamiltonian).numpy(), rtol=1e-6)
    # ... and the run's own metrics, computed in float32 during the run
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["r_hat_max"] == pytest.approx(float(_values(rhat(data)).max()), rel=2e-4)
    assert metrics["ess_bulk_min"] == pytest.approx(float(_values(ess(data, "bulk")).min()), rel=1e-5)


@pytest.mark.parametrize("kind", ["arviz", "arviz_base"])
def test_a_sample_result_converts_chain_major_with_arviz_names(monkeypatch, kind):
    library, *_ = _generation(kind)
    monkeypatch.setattr(arviz_export, "_library", lambda: library)
    energy = ebmcore.energy("gaussian", dim=3)
    sampler = NUTSSampler(energy, step_size=torch.linspace(0.4, 0.6, 4), max_tree_depth=5, fused=False)  # with H
    result = sampler.sample(
        torch.randn(4, 3, generator=torch.Generator().manual_seed(0)),
        30,
        return_trajectory=True,
        return_stats=True,
        generator=torch.Generator().manual_seed(1),
    )
    data = arviz_export.to_arviz(result, sampler)
    x, stats = _values(data["posterior"]), data["sample_stats"]
    assert np.array_equal(x, result.trajectory.transpose(0, 1).numpy())  # ArviZ's (chain, draw, *event_shape)
    np.testing.assert_allclose(
        _values(stats, "lp"), -energy.energy(result.trajectory.flatten(0, 1)).view(30, 4).T.numpy(), rtol=1e-6
    )
    assert np.array_equal(_values(stats, "tree_depth"), result.stats["tree_depth"].T.numpy())
    assert np.array_equal(_values(stats, "n_steps"), result.stats["n_leapfrog_steps"].T.numpy())
    assert np.array_equal(_values(stats, "energy"), result.stats["hamiltonian"].T.numpy())
    np.testing.assert_allclose(_values(stats, "step_size")[:, 0], np.linspace(0.4, 0.6, 4), rtol=1e-6)  # per chain
    # without statistics: a posterior alone
    plain = arviz_export.to_arviz(NUTSSampler(energy).sample(torch.zeros(2, 3), 5, return_trajectory=True))
    groups = plain.groups() if callable(plain.groups) else [g.strip("/") for g in plain.groups]
    assert "posterior" in groups and "sample_stats" not in groups


def test_netcdf_without_arviz_is_refused_before_sampling(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(arviz_export, "_library", lambda: None)
    (tmp_path / "hmc.toml").write_text(CONFIG)
    assert main(["sample", str(tmp_path / "hmc.toml"), "--out", str(tmp_path / "o"), "--format", "netcdf"]) == 2
    err = capsys.readouterr().err  # the flag asked for it: the flag is named, not a file
    assert (
        "error: --format netcdf: ArviZ is not installed (pip install 'ebm-samplers[arviz]'); or write draws.npz with "
        "--format npz."
        in err
        and "toml" not in err
    )
    (tmp_path / "nc.toml").write_text(CONFIG.replace("plots = false", 'plots = false\ndraws = "netcdf"'))
    assert main(["sample", str(tmp_path / "nc.toml"), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'nc.toml'} [output] draws = 'netcdf': ArviZ is not installed (pip install 'ebm-samplers[arviz]')" in err
    assert not (tmp_path / "o").exists()
    with pytest.raises(ebmcore.errors.MissingDependencyError, match=r"pip install 'ebm-samplers\[arviz\]'"):
        arviz_export.to_arviz(NUTSSampler(ebmcore.energy("gaussian", dim=2)).sample(torch.zeros(2, 2), 3, return_trajectory=True))
