"""gaussian_residual (a fitted Gaussian plus a learned correction), whitened_contrastive_divergence, AIS from a
full-covariance base, and the bundled `ebm train digits_density`."""

import json
import math

import pytest
import torch

import ebmcore
from ebmcore import EnergyModel
from ebmcore.errors import InputError
from ebm_losses import likelihood
from ebm_losses.gaussian_residual import GaussianResidualEnergy
from ebm_losses.whitened_cd import WhitenedContrastiveDivergence
from loss_problems import shortened_config
from ebm_samplers.ais import estimate_log_z


def _images(n=200, seed=0):
    """Quantised 'images' (n, 1, 4, 4) on [-1, 1] with correlated pixels and constant corners, like digits."""
    g = torch.Generator().manual_seed(seed)
    latent = torch.randn(n, 3, generator=g)
    mix = torch.randn(3, 16, generator=g)
    x = torch.tanh(latent @ mix / 2)
    x[:, [0, 3, 12, 15]] = -1.0
    return (torch.round((x + 1) * 8) / 8 - 1).reshape(n, 1, 4, 4)


@pytest.mark.parametrize("covariance", ["full", "diagonal"])
def test_at_zero_correction_the_model_is_the_fitted_gaussian(covariance):
    train, test = _images(300), _images(100, seed=1)
    model = GaussianResidualEnergy((1, 4, 4), hidden=(16,), covariance=covariance).fit_base(train)
    assert bool(model.fitted)
    with torch.no_grad():
        log_p = -model.compute_energy(test).double()
    closed = likelihood.gaussian_log_likelihood(
        train, test, diagonal=covariance == "diagonal", ridge=likelihood.quantum(train) ** 2 / 12
    )
    assert float(log_p.mean()) == pytest.approx(closed["log_likelihood"], abs=1e-3)
    assert float(log_p.std() / math.sqrt(len(log_p))) == pytest.approx(closed["standard_error"], abs=1e-4)
    if covariance == "diagonal":
        assert torch.equal(model.scale_tril, torch.diag(model.scale_tril.diagonal()))


def test_gradient_is_the_precision_times_the_offset_plus_the_whitened_correction():
    train = _images(300)
    model = GaussianResidualEnergy((1, 4, 4), hidden=(16,)).double().fit_base(train.double())
    x = _images(20, seed=2).double()
    precision = torch.cholesky_inverse(model.scale_tril)
    offset = x.flatten(1) - model.loc
    assert torch.allclose(model.gradient(x).flatten(1), offset @ precision, atol=1e-8)
    with torch.no_grad():  # a correction that is not zero: ∇E = Σ⁻¹(x − μ) + L⁻ᵀ∇g(z)
        for p in model.correction.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel()), dtype=p.dtype))
    z = model.whiten(x).requires_grad_(True)
    (grad_g,) = torch.autograd.grad(model.correction.compute_energy(z).sum(), z)
    expected = offset @ precision + grad_g @ model.inverse_tril
    assert torch.allclose(model.gradient(x).flatten(1), expected, atol=1e-8)
    assert torch.allclose(model.unwhiten(model.whiten(x)), x, atol=1e-10)


def test_gaussian_residual_rejects_bad_shapes_and_is_registered():
    assert ebmcore.registry.get("energy", "gaussian_residual").component is GaussianResidualEnergy
    assert ebmcore.registry.get("loss", "whitened_contrastive_divergence").component is WhitenedContrastiveDivergence
    with pytest.raises(InputError, match="covariance must be"):
        GaussianResidualEnergy((1, 4, 4), covariance="low-rank")
    with pytest.raises(InputError, match=r"give x of shape \(n, 1, 4, 4\)"):
        GaussianResidualEnergy((1, 4, 4)).compute_energy(torch.randn(3, 16))
    with pytest.raises(InputError, match="lacks whiten"):
        WhitenedContrastiveDivergence()(ebmcore.MLPEnergy(dim=2, hidden=(4,), seed=0), torch.randn(8, 2))
    with pytest.raises(InputError, match=r"is not fitted.*call energy.fit_base\(train\) first"):
        WhitenedContrastiveDivergence()(GaussianResidualEnergy((1, 4, 4), hidden=(4,)), torch.randn(8, 1, 4, 4))


class _Gaussian(EnergyModel):
    """``½(x − m)ᵀP(x − m)`` on ``(n, 3)``: ``log Z = ½·log det(2πP⁻¹)``."""

    def __init__(self, m, precision):
        super().__init__()
        self.event_shape = (3,)
        self.register_buffer("m", m)
        self.register_buffer("p", precision)

    def compute_energy(self, x):
        d = x - self.m
        return 0.5 * ((d @ self.p) * d).sum(1)


def test_ais_from_a_full_covariance_base_recovers_a_known_log_z():
    g = torch.Generator().manual_seed(0)
    a = torch.randn(3, 3, generator=g, dtype=torch.float64)
    cov = a @ a.T + 0.1 * torch.eye(3, dtype=torch.float64)
    target = _Gaussian(torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64), torch.linalg.inv(1.3 * cov))
    exact = 0.5 * float(torch.logdet(2 * math.pi * 1.3 * cov))
    base = torch.linalg.cholesky(cov)
    result = estimate_log_z(
        target, 256, 200, loc=torch.zeros(3, dtype=torch.float64), scale_tril=base, generator=torch.Generator().manual_seed(1)
    )
    assert abs(result.log_z - exact) < 4 * result.standard_error + 1e-3
    assert result.effective_sample_size > 100 and result.samples.shape == (256, 3)
    # the base itself: every weight is log Z₀ exactly
    same = estimate_log_z(
        _Gaussian(torch.zeros(3, dtype=torch.float64), torch.linalg.inv(cov)),
        16,
        5,
        loc=torch.zeros(3, dtype=torch.float64),
        scale_tril=base,
        generator=torch.Generator().manual_seed(2),
    )
    assert same.log_z == pytest.approx(0.5 * float(torch.logdet(2 * math.pi * cov)), abs=1e-9)
    assert same.effective_sample_size == pytest.approx(16)
    with pytest.raises(InputError, match="not both"):
        estimate_log_z(target, 4, 2, scale_tril=base, bounds=(-1.0, 1.0))
    with pytest.raises(InputError, match="shape"):
        estimate_log_z(target, 4, 2, scale_tril=torch.eye(2, dtype=torch.float64))
    with pytest.raises(InputError, match=r"lower triangular.*not its transpose"):  # an upper factor is not silently cut
        estimate_log_z(target, 4, 2, scale_tril=base.T)


def test_whitened_cd_moves_the_correction_and_keeps_its_chains():
    train = _images(256)
    model = GaussianResidualEnergy((1, 4, 4), hidden=(16,)).fit_base(train)
    loss = WhitenedContrastiveDivergence(n_steps=3, buffer_size=64, dequantize=0.125, sample_steps=5)
    value = loss(model, train[:32], generator=torch.Generator().manual_seed(0))
    assert value.dim() == 0 and torch.isfinite(value)
    value.backward()
    last = list(model.correction.parameters())[-2]  # the last layer's weight, zero at the start
    assert last.grad is not None and bool(last.grad.abs().sum() > 0)
    assert loss.chains.shape == (64, 16) and loss.last_negatives.shape == (32, 1, 4, 4)
    assert 0 < loss.acceptance <= 1
    state = loss.state_dict()
    again = WhitenedContrastiveDivergence()
    again.load_state_dict(state)
    assert torch.equal(again.chains, loss.chains) and again.step_size == loss.step_size
    samples = loss.generate(model, 10, train, torch.Generator().manual_seed(3))
    assert samples.shape == (10, 1, 4, 4) and torch.isfinite(samples).all()
    assert loss.negatives_report()["samples_model_density"] is True


def test_a_mixture_base_is_the_fitted_mixture_normalised_and_starts_the_chains():
    from sklearn.mixture import GaussianMixture

    train, test = _images(300).double(), _images(100, seed=1).double()
    model = GaussianResidualEnergy((1, 4, 4), hidden=(16,), components=3, ridge=0.01).double().fit_base(train)
    fit = GaussianMixture(3, covariance_type="full", reg_covar=0.01, random_state=0, max_iter=200).fit(train.flatten(1).numpy())
    with torch.no_grad():  # at g = 0, exp(−E) is scikit-learn's mixture density, point by point
        log_p = -model.compute_energy(test)
    assert torch.allclose(log_p, torch.as_tensor(fit.score_samples(test.flatten(1).numpy())), atol=1e-6)
    # exact base samples: their whitened energy's average is the mixture's entropy estimate, and they match its moments
    z = model.sample_base(20000, torch.Generator().manual_seed(0))
    x = model.unwhiten(z).flatten(1)
    assert torch.allclose(x.mean(0), torch.as_tensor(fit.means_.T @ fit.weights_), atol=0.03)
    with torch.no_grad():  # importance sampling from the mixture itself: log Z = 0 exactly at g = 0, with a correction below
        assert float(torch.logsumexp(-model.correction.compute_energy(z), 0) - math.log(len(z))) == pytest.approx(0.0, abs=1e-12)
    loss = WhitenedContrastiveDivergence(n_steps=2, buffer_size=32, dequantize=0.0, sample_steps=3)
    value = loss(model, train[:16], generator=torch.Generator().manual_seed(1))
    assert torch.isfinite(value) and loss.chains.shape == (32, 16)
    assert loss.generate(model, 5, train, torch.Generator().manual_seed(2)).shape == (5, 1, 4, 4)
    state = model.state_dict()  # the mixture travels with a checkpoint
    again = GaussianResidualEnergy((1, 4, 4), hidden=(16,), components=3).double()
    again.load_state_dict(state)
    with torch.no_grad():
        assert torch.allclose(-again.compute_energy(test), log_p, atol=1e-12)
    with pytest.raises(InputError, match="components must be a positive integer"):
        GaussianResidualEnergy((1, 4, 4), components=0)
    with pytest.raises(InputError, match="set covariance = 'full'"):
        GaussianResidualEnergy((1, 4, 4), components=2, covariance="diagonal")


def _short_digits_density(tmp_path, steps: int = 20):
    """The bundled ``digits_density`` configuration, shortened to seconds."""
    changes = [
        ("steps = 5000", f"steps = {steps}"),
        ("hidden = [256, 256]", "hidden = [32]"),
        ("sample_steps = 1000", "sample_steps = 7"),
        ("image_samples = 400", "image_samples = 50"),
        ("ais_chains = 128", "ais_chains = 16"),
        ("ais_temperatures = 300", "ais_temperatures = 20"),
        ("plots = true", "plots = false"),
    ]
    return shortened_config("digits_density", changes, tmp_path / "digits_density.toml")


def test_train_digits_density_reports_the_likelihood_from_the_models_own_base(tmp_path):
    from ebmcore.cli import main

    out = tmp_path / "run"
    assert main(["train", str(_short_digits_density(tmp_path)), "--out", str(out), "--quiet"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    ais = metrics["ais"]
    assert ais["domain"].startswith("R^64, annealed from the model's fitted Gaussian base")
    assert {"test_log_likelihood", "standard_error", "reliable", "checks"} <= set(ais)
    assert ais["checks"]["ess"]["effective_sample_size"] > 12  # 16 chains, the model near its base
    # 20 steps from the Gaussian: the model is still close to it
    assert abs(ais["test_log_likelihood"] - metrics["baselines"]["gaussian"]["log_likelihood"]) < 2.0
    assert metrics["negatives"]["samples_model_density"] is True
    assert torch.load(out / "samples.pt").shape == (50, 1, 8, 8)
    assert {"classifier_ratio", "confident_classes", "spread"} <= set(metrics["sample_quality"])


@pytest.mark.slow
def test_the_bundled_digits_density_run_beats_the_gaussians_with_a_converged_estimate(tmp_path):
    """The full `ebm train digits_density` (about 2 minutes on 2 cores): AIS reliable (ESS at least 50 of 128 chains,
    300 and 150 temperatures agree), the held-out log-likelihood above the diagonal and the full-covariance
    Gaussians fitted to the same split."""
    from ebmcore.cli import main

    out = tmp_path / "digits_density"
    assert main(["train", "digits_density", "--out", str(out), "--quiet"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    ais, base = metrics["ais"], metrics["baselines"]
    assert ais["reliable"] and ais["checks"]["ess"]["effective_sample_size"] >= 50
    assert ais["test_log_likelihood"] > base["diagonal_gaussian"]["log_likelihood"]
    assert ais["test_log_likelihood"] > base["gaussian"]["log_likelihood"]


@pytest.mark.slow
def test_the_bundled_digits_mixture_run_meets_both_targets(tmp_path):
    """The full `ebm train digits_mixture` (about 2 minutes on 2 cores). Samples: classifier ratio at least 0.8, all
    ten classes, spread 0.8-1.2, saturated and mid-grey fractions within 1.5x the data's. Density: log Z by importance
    sampling from the model's own mixture base (its exact samples; at least 10 % of 8,192 draws effective, and two
    halves agree), the held-out log-likelihood above the full-covariance Gaussian and, paired, above the model's own
    10-component mixture base (the correction's gain) by several standard errors."""
    from ebmcore.cli import main
    from ebm_losses.train_job import _image_data

    out = tmp_path / "digits_mixture"
    assert main(["train", "digits_mixture", "--out", str(out), "--quiet"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    quality = metrics["sample_quality"]
    assert quality["classifier_ratio"] >= 0.8 and quality["confident_classes"] == 10
    assert 0.8 <= quality["spread"] <= 1.2 and quality["pixel_fractions_ok"]
    saved = torch.load(out / "model.pt", weights_only=False)
    model = GaussianResidualEnergy(**saved["params"]).double()
    model.load_state_dict(saved["state_dict"])
    config = json.loads((out / "config.json").read_text())
    _, test, _ = _image_data(config["data"])
    with torch.no_grad():
        z = model.sample_base(8192, torch.Generator().manual_seed(1), like=test.double())
        log_w = -model.correction.compute_energy(z)  # exp(−E) = mixture · exp(−g): Z = E_mixture[exp(−g)]
        halves = [float(torch.logsumexp(h, 0) - math.log(len(h))) for h in log_w.chunk(2)]
        log_z = float(torch.logsumexp(log_w, 0) - math.log(len(log_w)))
        w = (log_w - log_w.max()).exp()
        assert float(w.sum().square() / w.square().sum()) >= 819
        assert abs(halves[0] - halves[1]) < 0.05
        x = test.double()
        log_p = -model.compute_energy(x) - log_z
        gain = log_p + model.base_energy(model.whiten(x)) + model.log_normalizer()  # minus the base's own log p
    se = float(log_p.std() / math.sqrt(len(log_p)))
    assert float(log_p.mean()) - metrics["baselines"]["gaussian"]["log_likelihood"] > 3 * se
    assert float(gain.mean()) > 5 * float(gain.std() / math.sqrt(len(gain)))
    # the run's own report anneals and importance-samples from the same mixture base: it agrees, and says reliable
    deq = metrics["dequantised"]
    ais_log_z, ais_se = deq["log_z"]["ais"]
    assert deq["reliable"] and abs(ais_log_z - log_z) < 4 * ais_se + 0.02, (ais_log_z, ais_se, log_z)
    assert deq["margins"]["gaussian"]["margin"] > 3 * deq["margins"]["gaussian"]["standard_error"]
