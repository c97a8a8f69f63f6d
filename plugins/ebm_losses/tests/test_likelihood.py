"""Honest model reports: the baselines against closed forms, and estimates that disagree (AIS at two temperature
counts, grid against AIS) warn and are marked unreliable."""

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
