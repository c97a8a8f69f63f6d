"""Honest model reports: the baselines against closed forms, and estimates that disagree (AIS at two temperature
counts, grid against AIS, AIS against importance sampling) warn and are marked unreliable; dequantised data in bits
per dimension, baselines with ridges chosen on validation."""

import math
import warnings

import pytest
import torch

from ebmcore import GaussianEnergy, GaussianMixtureEnergy
from ebmcore.errors import InputError
from ebm_losses import likelihood
from ebm_losses.image_report import ais_log_likelihood
from ebm_losses.likelihood import EstimatesDisagreeWarning
from ebm_losses.train_job import grid_nll, held_out_report

COV = torch.tensor([[1.0, 0.6, 0.0], [0.6, 2.0, -0.3], [0.0, -0.3, 0.5]], dtype=torch.float64)


def _gaussian_draws(n, seed, cov=COV, mean=None):
    g = torch.Generator().manual_seed(seed)
    mean = torch.zeros(cov.shape[0], dtype=torch.float64) if mean is None else mean
    return mean + torch.randn(n, cov.shape[0], generator=g, dtype=torch.float64) @ torch.linalg.cholesky(cov).T


def test_the_uniform_baseline_is_exact_and_says_when_points_leave_its_box():
    test = torch.rand(50, 1, 4, 4, dtype=torch.float64) * 2 - 1
    report = likelihood.uniform_log_likelihood(test, -1.0, 1.0)
    assert report["log_likelihood"] == -16 * math.log(2.0) and report["standard_error"] == 0.0
    assert report["n_outside"] == 0 and report["dim"] == 16
    test[3, 0, 1, 2] = 1.5
    outside = likelihood.uniform_log_likelihood(test, -1.0, 1.0)
    assert outside["log_likelihood"] is None and outside["n_outside"] == 1


def test_the_gaussian_baselines_are_the_fitted_gaussians_and_meet_the_analytic_value():
    train, test = _gaussian_draws(20000, 0), _gaussian_draws(20000, 1)
    full = likelihood.gaussian_log_likelihood(train, test)
    diag = likelihood.gaussian_log_likelihood(train, test, diagonal=True)
    mean = train.mean(0)
    cov = (train - mean).T @ (train - mean) / len(train)  # the maximum-likelihood fit
    fitted = torch.distributions.MultivariateNormal(mean, cov).log_prob(test)
    assert full["log_likelihood"] == pytest.approx(float(fitted.mean()), abs=1e-10)
    assert full["standard_error"] == pytest.approx(float(fitted.std() / math.sqrt(len(test))), rel=1e-8)
    independent = torch.distributions.Normal(mean, cov.diagonal().sqrt()).log_prob(test).sum(1)
    assert diag["log_likelihood"] == pytest.approx(float(independent.mean()), abs=1e-10)
    # E log N(x; Σ) = −½ log|2πeΣ| for x ~ N(0, Σ); the diagonal fit scores −½ Σ log(2πe Σᵢᵢ), lower by the correlations
    exact_full = -0.5 * float(torch.logdet(2 * math.pi * math.e * COV))
    exact_diag = -0.5 * float(torch.log(2 * math.pi * math.e * COV.diagonal()).sum())
    assert abs(full["log_likelihood"] - exact_full) < 4 * full["standard_error"] + 2e-3
    assert abs(diag["log_likelihood"] - exact_diag) < 4 * diag["standard_error"] + 2e-3
    assert exact_diag < exact_full - 0.1


def test_quantised_data_with_a_constant_pixel_gets_the_dequantisation_ridge():
    g = torch.Generator().manual_seed(0)
    pixels = torch.randint(0, 17, (400, 1, 3, 3), generator=g).double()
    pixels[:, 0, 0, 0] = 0  # a pixel that is always 0, as in the digits' corners
    x = pixels / 8 - 1  # 0..16 onto [-1, 1]: steps of 1/8
    train, test = x[:300], x[300:]
    assert likelihood.quantum(train) == 0.125
    with pytest.raises(InputError, match="covariance is singular .* give a ridge > 0"):
        likelihood.gaussian_log_likelihood(train, test)
    report = likelihood.baselines(train, test, (-1.0, 1.0))
    assert report["gaussian"]["ridge"] == report["diagonal_gaussian"]["ridge"] == 0.125**2 / 12
    assert report["uniform"]["log_likelihood"] == -9 * math.log(2)
    assert all(math.isfinite(report[k]["log_likelihood"]) for k in ("gaussian", "diagonal_gaussian"))


def test_compare_warns_and_records_only_beyond_the_combined_errors():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert likelihood.compare("q", ("a", 1.0, 0.1), ("b", 1.25, 0.1)) is None  # 1.8 combined errors
    with pytest.warns(EstimatesDisagreeWarning, match=r"q: a gives 1.000 ± 0.100 and b 2.000 ± 0.100, 1 nats apart \(7 comb"):
        record = likelihood.compare("q", ("a", 1.0, 0.1), ("b", 2.0, 0.1))
    assert record["estimates"] == {"a": [1.0, 0.1], "b": [2.0, 0.1]} and record["difference"] == -1.0


def _two_d(seed=0):
    train, test = _gaussian_draws(2000, seed, COV[:2, :2]), _gaussian_draws(500, seed + 1, COV[:2, :2])
    return train.float(), test.float()


def test_grid_and_ais_agree_on_a_normalisable_energy_and_the_report_is_reliable():
    train, test = _two_d()
    energy = GaussianEnergy(torch.zeros(2), covariance=COV[:2, :2].float())
    lim = 1.25 * float(train.abs().max())
    metrics = {
        "held_out_nll": grid_nll(energy, test, lim),
        "ais": ais_log_likelihood(energy, train, test, n_chains=128, n_temperatures=100, seed=0),
    }
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        report = held_out_report(energy, train, test, lim, False, metrics)
    exact = float(torch.distributions.MultivariateNormal(torch.zeros(2), COV[:2, :2].float()).log_prob(test).mean())
    assert report["warnings"] == [] and metrics["ais"]["reliable"] and report["grid"]["reliable"]
    assert abs(metrics["ais"]["test_log_likelihood"] - exact) < 4 * metrics["ais"]["standard_error"] + 1e-3
    assert abs(report["grid"]["test_log_likelihood"] - exact) < report["grid"]["error"] + 1e-3
    # the true density is the Gaussian: the fitted Gaussian baseline matches it, the uniform one is far below
    assert abs(report["baselines"]["gaussian"]["log_likelihood"] - exact) < 0.01
    assert report["baselines"]["uniform"]["log_likelihood"] < exact - 1


def test_an_energy_with_mass_outside_the_grid_makes_the_grid_unreliable_by_its_own_check():
    """exp(−E) = N(0, 10² I) (unnormalised): the grid over [−L, L]² (L ≈ 5) holds a small part of its mass; the box
    widened 1.5× holds more, so the grid's error is large; AIS over the plane finds the true value."""
    train, test = _two_d()
    energy = GaussianEnergy(torch.zeros(2), covariance=100 * torch.eye(2))
    lim = 1.25 * float(train.abs().max())
    metrics = {
        "held_out_nll": grid_nll(energy, test, lim),
        "ais": ais_log_likelihood(energy, train, test, n_chains=128, n_temperatures=100, seed=0),
    }
    report = held_out_report(energy, train, test, lim, False, metrics)
    exact = float(torch.distributions.MultivariateNormal(torch.zeros(2), 100 * torch.eye(2)).log_prob(test).mean())
    assert abs(metrics["ais"]["test_log_likelihood"] - exact) < 4 * metrics["ais"]["standard_error"] + 1e-3
    assert metrics["ais"]["reliable"] and report["grid"]["reliable"] is False and report["grid"]["error"] > 0.5
    assert report["grid"]["test_log_likelihood"] > exact + 1


def test_ais_that_misses_a_mode_disagrees_with_the_grid_warns_and_is_unreliable():
    """exp(−E) is a normalised mixture: 0.1·N(0, I) + 0.9·N((4, −4), 0.1² I), the data from the first component.
    AIS from the data's Gaussian fit never reaches the narrow far mode: it reports log Z ≈ log 0.1 with every check
    of its own passing (effective sample size ≈ all chains, two temperature counts agreeing); the grid, exact here,
    disagrees by 2.3 nats, so both are marked unreliable and a warning is recorded."""
    g = torch.Generator().manual_seed(0)
    train, test = torch.randn(2000, 2, generator=g), torch.randn(500, 2, generator=g)
    energy = GaussianMixtureEnergy(torch.tensor([[0.0, 0.0], [4.0, -4.0]]), torch.tensor([1.0, 0.1]), torch.tensor([0.1, 0.9]))
    lim = 1.25 * float(train.abs().max())
    metrics = {
        "held_out_nll": grid_nll(energy, test, lim),
        "ais": ais_log_likelihood(energy, train, test, n_chains=128, n_temperatures=100, seed=0),
    }
    assert metrics["ais"]["reliable"] and metrics["ais"]["checks"]["ess"]["effective_sample_size"] > 100
    with pytest.warns(
        EstimatesDisagreeWarning,
        match=r"held-out log-likelihood: the grid gives -5.108 ± 0.000 and AIS "
        r"-2.80\d ± 0.001, 2.3 nats apart",
    ):
        report = held_out_report(energy, train, test, lim, False, metrics)
    exact = float(-energy.compute_energy(test).mean())  # the mixture is normalised
    assert abs(report["grid"]["test_log_likelihood"] - exact) < 1e-4
    assert metrics["ais"]["reliable"] is False and report["grid"]["reliable"] is False
    (record,) = report["warnings"]
    assert set(record["estimates"]) == {"the grid", "AIS"} and abs(record["difference"]) > 3 * record["combined_error"]


def test_ais_at_two_temperature_counts_that_disagree_is_unreliable_and_warns():
    """The base (the training data's Gaussian fit, around 0) is far from exp(−E) = N((4, 4), 0.2² I): one temperature
    is plain importance sampling and misses the mode, 200 anneal to it."""
    train, test = _two_d()
    energy = GaussianEnergy(torch.full((2,), 4.0), covariance=0.04 * torch.eye(2))
    with pytest.warns(
        EstimatesDisagreeWarning,
        match=r"held-out log-likelihood by AIS: 200 temperatures gives .* and "
        r"1 temperatures .* AIS has not converged",
    ):
        report = ais_log_likelihood(energy, train, test, n_chains=128, n_temperatures=200, seed=0, check_temperatures=1)
    assert report["checks"]["temperatures"]["passed"] is False and report["reliable"] is False
    exact = float(torch.distributions.MultivariateNormal(torch.full((2,), 4.0), 0.04 * torch.eye(2)).log_prob(test).mean())
    assert abs(report["test_log_likelihood"] - exact) < 4 * report["standard_error"] + 1e-2
    assert report["warnings"][0]["quantity"] == "held-out log-likelihood by AIS"


def test_ais_whose_effective_sample_size_fails_its_check_records_a_warning_that_names_the_fix(tmp_path):
    """Issue 40: digits_eqm's AIS was "not reliable: effective sample size 1 of 128 chains" with an empty ``warnings``.
    Two temperatures from the data's Gaussian fit (around 0) to exp(−E) = N((4, 4), 0.2² I): a few chains carry all
    the weight; the failed check is a record of ``warnings`` saying why and what to raise, and a summary line."""
    from ebm_losses.train_job import summary

    train, test = _two_d()
    energy = GaussianEnergy(torch.full((2,), 4.0), covariance=0.04 * torch.eye(2))
    ais = ais_log_likelihood(energy, train, test, n_chains=128, n_temperatures=2, seed=0, check_temperatures=0)
    assert ais["checks"]["ess"]["passed"] is False and ais["reliable"] is False
    (record,) = ais["warnings"]
    assert record["effective_sample_size"] < record["threshold"] == 12.8
    assert "not reliable" in record["message"] and "ais_chains and ais_temperatures" in record["message"]
    assert "a base closer to the model" in record["message"]
    metrics = {
        "held_out_nll": None,
        "ais": ais,
        "steps": 1,
        "final_loss": 0.0,
        "wall_time_s": 1.0,
        "throughput_samples_per_s": None,
    }
    metrics.update(held_out_report(energy, train, test, 0.0, False, metrics))
    assert metrics["warnings"] == [record]
    assert f"  warning: {record['message']}" in summary(metrics, tmp_path).splitlines()


def _sampler_problems():
    """The samplers' shared test problems (``gaussian_with_log_z``), loaded from their file."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parents[2] / "ebm_samplers" / "tests" / "sampler_problems.py"
    spec = importlib.util.spec_from_file_location("sampler_problems", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_dequantised_levels_fill_their_bins_and_the_uniform_density_has_log2_k_bits_per_dim():
    k, step = 17, 2 / 17
    levels = torch.randint(0, k, (4000, 1, 2, 2), generator=torch.Generator().manual_seed(0)).double()
    centres = -1 + (2 * levels + 1) / k  # the bins' centres: 17 bins of width 2/17 tile [-1, 1]
    x = likelihood.dequantise(centres, step, torch.Generator().manual_seed(1))
    offset = (x - centres) / step
    assert float(offset.min()) >= -0.5 and float(offset.max()) < 0.5
    assert float(offset.mean()) == pytest.approx(0.0, abs=0.01) and float(offset.var()) == pytest.approx(1 / 12, rel=0.03)
    uniform = likelihood.uniform_log_likelihood(x, -1.0, 1.0)["log_likelihood"]
    assert likelihood.bits_per_dim(uniform, 4, step) == pytest.approx(math.log2(k), abs=1e-12)
    # the bound is tight for a density constant on each bin: the levels' own distribution, in bits
    assert likelihood.bits_per_dim(-4 * math.log(2.0), 4, 1.0) == pytest.approx(1.0)
    with pytest.raises(InputError, match="step must be a finite number > 0"):
        likelihood.dequantise(centres, 0.0, torch.Generator())


def test_chosen_baselines_pick_ridges_and_components_on_validation_and_score_the_mixture_of_two_clusters():
    """Two unit Gaussian clusters 8 apart with weight ½: the mixture chooses 2 or more components and meets
    ``−(3/2)·log 2πe − log 2``; the full Gaussian (variance 1 + 16 along the axis) falls ``½·log 17 − log 2`` short."""
    g = torch.Generator().manual_seed(0)
    n, d = 3000, 3
    centre = torch.tensor([4.0, 0.0, 0.0], dtype=torch.float64)

    def draw(m):
        sign = torch.randint(0, 2, (m, 1), generator=g).double() * 2 - 1
        return sign * centre + torch.randn(m, d, generator=g, dtype=torch.float64)

    train, test = draw(n), draw(n)
    report, per_point = likelihood.chosen_baselines(
        train, test, (-10.0, 10.0), step=0.01, seed=0, ridge_factors=(0.0, 1.0), components=(1, 2)
    )
    assert report["gaussian_mixture"]["components"] >= 2 and report["gaussian_mixture"]["validation_split"] == 600
    exact = -0.5 * d * math.log(2 * math.pi * math.e)  # each point under its own unit Gaussian (clusters 8 sd apart) ...
    exact -= math.log(2)  # ... with weight ½
    assert report["gaussian_mixture"]["log_likelihood"] == pytest.approx(
        exact, abs=4 * report["gaussian_mixture"]["standard_error"] + 0.02
    )
    gap = likelihood.margins(per_point["gaussian_mixture"], 0.0, {"gaussian": per_point["gaussian"]})["gaussian"]
    assert gap["margin"] == pytest.approx(0.5 * math.log(17) - math.log(2), abs=4 * gap["standard_error"] + 0.02)
    for key in ("diagonal_gaussian", "gaussian"):
        best = max(report[key]["validation"], key=lambda v: v["log_likelihood"])
        assert report[key]["ridge"] == best["ridge"]
        assert report[key]["bits_per_dim"] == likelihood.bits_per_dim(report[key]["log_likelihood"], d, 0.01)
    assert set(per_point) == {"uniform", "diagonal_gaussian", "gaussian", "gaussian_mixture"}
    assert float(per_point["gaussian"].mean()) == pytest.approx(report["gaussian"]["log_likelihood"])


def test_margins_pair_the_points_and_carry_the_error_of_log_z():
    model = torch.linspace(-3, 3, 100, dtype=torch.float64)
    same = likelihood.margins(model, 0.2, {"a": model.clone(), "b": model - 1.5})
    assert same["a"] == {"margin": 0.0, "standard_error": 0.2}  # identical points: only log Z's error is left
    assert same["b"]["margin"] == pytest.approx(1.5) and same["b"]["standard_error"] == pytest.approx(0.2)


def test_importance_sampling_meets_the_exact_log_z_of_a_gaussian_and_of_one_restricted_to_a_box():
    energy, exact = _sampler_problems().gaussian_with_log_z(5, seed=3)
    cov = energy.covariance if hasattr(energy, "covariance") else torch.linalg.inv(energy.precision)
    tril = torch.linalg.cholesky(1.2 * cov.double())  # a slightly broader proposal: bounded weights
    result = likelihood.importance_log_z(energy, energy.mean.double(), tril, event_shape=(5,), n=20000, seed=0)
    assert abs(result["log_z"] - exact) < 4 * result["standard_error"] + 1e-3 and result["standard_error"] < 0.02
    assert result["effective_sample_size"] > 10000
    # N(0, 1) restricted to [-1, 1]: log Z = log(√(2π)·(Φ(1) − Φ(−1)))
    standard = GaussianEnergy(torch.zeros(1, dtype=torch.float64), covariance=torch.eye(1, dtype=torch.float64))
    boxed = likelihood.importance_log_z(
        standard, torch.zeros(1), torch.eye(1), event_shape=(1,), n=20000, seed=1, bounds=(-1.0, 1.0)
    )
    truth = math.log(math.sqrt(2 * math.pi) * math.erf(1 / math.sqrt(2)))
    assert abs(boxed["log_z"] - truth) < 4 * boxed["standard_error"] and boxed["standard_error"] < 0.01


def _dequantised_case(log_z_shift: float):
    """A normalised Gaussian energy on 4 coordinates and an AIS record whose log Z is off by ``log_z_shift``."""
    from ebm_losses.train_report import dequantised_report

    cov = 0.1 * torch.eye(4, dtype=torch.float64) + 0.02
    energy = GaussianEnergy(torch.zeros(4, dtype=torch.float64), covariance=cov)
    exact = 2 * math.log(2 * math.pi) + 0.5 * float(torch.logdet(cov))
    train, test = _gaussian_draws(2000, 5, cov=cov), _gaussian_draws(500, 6, cov=cov)
    e = energy.compute_energy(test)
    ais = {
        "log_z": {"log_z": exact + log_z_shift, "standard_error": 0.01},
        "test_log_likelihood": float(-e.mean()) - exact - log_z_shift,
        "test_mean_se": float(e.std() / math.sqrt(500)),
        "reliable": True,
        "checks": {},
        "domain": "R^4",
    }
    records: list = []
    base, deq = dequantised_report(energy, train, test, {"levels": 17, "step": 2 / 17}, ais, records, seed=0)
    return base, deq, ais, records


def test_the_second_estimate_of_log_z_confirms_a_right_ais_and_catches_a_wrong_one():
    base, deq, ais, records = _dequantised_case(0.0)
    assert deq["reliable"] and ais["reliable"] and not records
    assert ais["checks"]["importance_sampling"]["passed"]
    # the model is the Gaussian that generated the data: its margin over the fitted full Gaussian is ~0
    margin = deq["margins"]["gaussian"]
    assert abs(margin["margin"]) < 4 * margin["standard_error"] + 0.02
    assert deq["bits_per_dim"] == likelihood.bits_per_dim(deq["test_log_likelihood"], 4, 2 / 17)
    with pytest.warns(EstimatesDisagreeWarning, match=r"log Z: AIS gives .* and importance sampling"):
        _, wrong, ais, records = _dequantised_case(-0.5)  # AIS missing mass: log Z 0.5 nats too low
    assert not wrong["reliable"] and not ais["reliable"] and len(records) == 1
    assert records[0]["quantity"] == "log Z" and "effective sample size" in records[0]["message"]
    lines = __import__("ebm_losses.train_report", fromlist=["_normaliser_line"])._normaliser_line(wrong)
    assert "DISAGREE" in lines and f"{wrong['log_z']['ais'][0]:.3f}" in lines


def test_importance_sampling_from_an_exact_base_meets_the_log_z_of_a_mixture():
    """A two-mode target (normalised: ``log Z = 0``) is hopeless for a Gaussian proposal at its mean, exact from a
    mixture base at its modes, given in whitened coordinates ``x = loc + Lz``."""
    from ebmcore import GaussianMixtureEnergy
    from ebm_samplers.ais import ExactBase

    means = torch.tensor([[-4.0, 0.0], [4.0, 0.0]], dtype=torch.float64)
    target = GaussianMixtureEnergy(means, stds=torch.tensor([0.5, 0.7], dtype=torch.float64), weights=torch.tensor([0.3, 0.7]))
    loc, tril = torch.zeros(2, dtype=torch.float64), 2.0 * torch.eye(2, dtype=torch.float64)
    z_modes = GaussianMixtureEnergy(means / 2, stds=torch.tensor([0.4, 0.4], dtype=torch.float64))

    def sample(n, generator):
        k = torch.randint(2, (n,), generator=generator)
        return means[k] / 2 + 0.4 * torch.randn(n, 2, generator=generator, dtype=torch.float64)

    base = ExactBase(z_modes.compute_energy, sample, 0.0)
    est = likelihood.importance_log_z(target, loc, tril, event_shape=(2,), n=8192, seed=0, base=base)
    assert est["effective_sample_size"] > 2000 and abs(est["log_z"]) < 4 * est["standard_error"] + 1e-3, est


def test_importance_sampling_with_too_few_effective_draws_cannot_confirm_ais():
    """A model 10× narrower per coordinate than the data's fitted Gaussian: importance sampling from that Gaussian
    keeps a handful of effective draws, so even a right AIS ``log Z`` is not confirmed and the run is not reliable."""
    from ebm_losses.train_report import MIN_CROSS_CHECK_ESS, dequantised_report

    cov = 0.1 * torch.eye(4, dtype=torch.float64)
    energy = GaussianEnergy(torch.zeros(4, dtype=torch.float64), covariance=0.001 * torch.eye(4, dtype=torch.float64))
    exact = 2 * math.log(2 * math.pi) + 0.5 * float(torch.logdet(0.001 * torch.eye(4, dtype=torch.float64)))
    train, test = _gaussian_draws(2000, 5, cov=cov), _gaussian_draws(500, 6, cov=cov)
    e = energy.compute_energy(test)
    ais = {
        "log_z": {"log_z": exact, "standard_error": 0.01},
        "test_log_likelihood": float(-e.mean()) - exact,
        "test_mean_se": float(e.std() / math.sqrt(500)),
        "reliable": True,
        "checks": {},
        "domain": "R^4",
    }
    records: list = []
    _, deq, ais, records = (
        *dequantised_report(energy, train, test, {"levels": 17, "step": 2 / 17}, ais, records, seed=0),
        ais,
        records,
    )
    second = ais["checks"]["importance_sampling"]
    assert second["effective_sample_size"] < MIN_CROSS_CHECK_ESS and not second["passed"]
    assert not deq["reliable"] and len(records) == 1 and "too few to cross-check" in records[0]["message"]


def test_smc_gives_a_third_log_z_that_confirms_a_right_ais_and_catches_a_wrong_one():
    """``[output] smc_particles``: adaptive tempered SMC from the importance sampler's base, held to AIS's ``log Z``."""
    from ebm_losses.train_report import dequantised_report

    cov = 0.1 * torch.eye(4, dtype=torch.float64) + 0.02
    energy = GaussianEnergy(torch.zeros(4, dtype=torch.float64), covariance=cov)
    exact = 2 * math.log(2 * math.pi) + 0.5 * float(torch.logdet(cov))
    train, test = _gaussian_draws(2000, 5, cov=cov), _gaussian_draws(500, 6, cov=cov)
    e = energy.compute_energy(test)

    def case(shift):
        ais = {
            "log_z": {"log_z": exact + shift, "standard_error": 0.01},
            "test_log_likelihood": float(-e.mean()) - exact - shift,
            "test_mean_se": float(e.std() / math.sqrt(500)),
            "reliable": True,
            "checks": {},
            "domain": "R^4",
        }
        records: list = []
        _, deq = dequantised_report(energy, train, test, {"levels": 17, "step": 2 / 17}, ais, records, 0, smc_particles=512)
        return deq, ais, records

    deq, ais, records = case(0.0)
    smc, se = deq["log_z"]["smc"]
    assert abs(smc - exact) < 4 * se + 0.01 and se < 0.1, (smc, se, exact)
    assert deq["reliable"] and ais["checks"]["smc"]["passed"] and not records
    line = __import__("ebm_losses.train_report", fromlist=["_normaliser_line"])._normaliser_line(deq)
    assert f", SMC {smc:.3f} ± {se:.3f}" in line and line.endswith(": agree")
    with pytest.warns(EstimatesDisagreeWarning):
        deq, ais, records = case(-0.5)
    assert not deq["reliable"] and not ais["checks"]["smc"]["passed"]
    assert [r["message"].split(":")[0] for r in records] == ["log Z", "log Z"] and "SMC" in records[1]["message"]
