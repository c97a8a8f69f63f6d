"""Joint energy models (JEM): the energy's closed forms (``E(x) = −logsumexp f(x)``, ``p(y|x) = softmax f(x)``, its
gradient the posterior mean of the class energies' gradients), the loss reducing to cross-entropy, the expected
calibration error on constructed examples, a labelled 2-d toy trained to the Bayes accuracy, the label errors, and
(marker ``slow``) the bundled ``ebm train digits_jem`` against its targets."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

import ebmcore
from ebmcore.errors import InputError
from ebm_losses import ContrastiveDivergence, Trainer
from ebm_losses.jem import ClassConditionalEnergy, JointEnergy, JointEnergyLoss, sample_classes
from ebm_losses.jem_report import expected_calibration_error


def _energy(k: int = 3, d: int = 2) -> JointEnergy:
    return JointEnergy((d,), k, hidden=(16,), seed=0).double()


def test_the_energy_is_minus_logsumexp_of_the_logits_and_p_y_given_x_their_softmax():
    energy = _energy(k=4, d=3)
    x = torch.randn(7, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    f = energy.logits(x)
    assert f.shape == (7, 4)
    torch.testing.assert_close(energy.compute_energy(x), -f.exp().sum(1).log())
    torch.testing.assert_close(energy.predict_proba(x), f.exp() / f.exp().sum(1, keepdim=True))
    y = torch.tensor([0, 1, 2, 3, 0, 1, 2])
    torch.testing.assert_close(energy.class_energy(x, y), -f[torch.arange(7), y])
    torch.testing.assert_close(energy.class_energy(x, 2), -f[:, 2])
    # p(y|x) = exp(E(x) − E(x, y)): the joint and the marginal are one model
    e_xy = torch.stack([energy.class_energy(x, c) for c in range(4)], 1)
    torch.testing.assert_close((energy.compute_energy(x)[:, None] - e_xy).exp(), energy.predict_proba(x))
    assert ebmcore.registry.get("energy", "joint_energy").component is JointEnergy
    assert ebmcore.registry.get("loss", "jem").component is JointEnergyLoss


def test_the_convolutional_network_takes_images_and_a_seed_leaves_the_global_rng_alone():
    state = torch.get_rng_state()
    energy = JointEnergy((1, 7, 9), 5, hidden=(8,), widths=(4, 6, 6), seed=3)  # 7×9 → 7×9 → 4×5 → 2×3
    assert torch.equal(torch.get_rng_state(), state)
    again = JointEnergy((1, 7, 9), 5, hidden=(8,), widths=(4, 6, 6), seed=3)
    x = torch.randn(2, 1, 7, 9)
    assert energy.logits(x).shape == (2, 5) and torch.equal(energy.logits(x), again.logits(x))
    with pytest.raises(InputError, match=r"x has event shape \(1, 8, 8\), the energy \(1, 7, 9\)"):
        energy.logits(torch.zeros(2, 1, 8, 8))
    with pytest.raises(InputError, match=r"convolutions \(widths\) need images of shape \(C, H, W\)"):
        JointEnergy((2,), 2, widths=(4,))


def test_the_gradient_is_the_posterior_mean_of_the_class_energies_gradients():
    """``∇ₓE(x) = Σ_y p(y|x)·∇ₓE(x, y)``, with each ``∇ₓE(x, y) = −∇ₓf_y`` from the logits' Jacobian."""
    energy = _energy(k=3, d=2)
    x = torch.randn(5, 2, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    jac = torch.stack([torch.autograd.functional.jacobian(lambda z: energy.logits(z[None])[0], row) for row in x])  # (5, 3, 2)
    expected = -(energy.predict_proba(x).detach()[:, :, None] * jac).sum(1)
    torch.testing.assert_close(energy.gradient(x), expected)
    torch.testing.assert_close(energy.score(x), -expected)


def test_the_loss_is_cross_entropy_without_the_generative_term_and_adds_cd_with_it():
    energy = _energy(k=3, d=2)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 2, generator=g, dtype=torch.float64)
    y = torch.randint(0, 3, (32,), generator=g)
    plain = JointEnergyLoss(generative_weight=0.0)
    torch.testing.assert_close(plain(energy, x, labels=y, generator=g), F.cross_entropy(energy.logits(x), y))
    assert plain.last_negatives is None  # no chain ran
    joint = JointEnergyLoss(n_steps=3, generative_weight=0.5, buffer_size=64, sampler_options={"step_size": 0.01})
    value = joint(energy, x, labels=y, generator=g)
    negatives = joint.last_negatives
    assert negatives.shape == x.shape
    cd = energy.compute_energy(x).mean() - energy.compute_energy(negatives).mean()
    torch.testing.assert_close(value, F.cross_entropy(energy.logits(x), y) + 0.5 * cd)
    value.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in energy.parameters())


def test_the_expected_calibration_error_of_constructed_predictions():
    """Two bins: confidence 0.9 right once in two (gap 0.4), 0.7 right twice (gap 0.3): ECE = ½·0.4 + ½·0.3."""
    p = torch.tensor([[0.9, 0.1], [0.9, 0.1], [0.3, 0.7], [0.7, 0.3]])
    y = torch.tensor([0, 1, 1, 0])
    assert expected_calibration_error(p, y) == pytest.approx(0.35)
    # calibrated within each bin: a quarter of the 0.75-confident predictions wrong
    p = torch.tensor([[0.75, 0.25]]).repeat(8, 1)
    assert expected_calibration_error(p, torch.tensor([0, 0, 0, 0, 0, 0, 1, 1])) == pytest.approx(0.0, abs=1e-12)
    # against a loop over the 15 bins on random predictions
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(3 * torch.randn(500, 4, generator=g, dtype=torch.float64), 1)
    y = torch.randint(0, 4, (500,), generator=g)
    conf, pred = p.max(1)
    ece = 0.0
    for b in range(15):
        inside = (conf > b / 15) & (conf <= (b + 1) / 15)
        if inside.any():
            ece += float(inside.double().mean() * ((pred[inside] == y[inside]).double().mean() - conf[inside].mean()).abs())
    assert expected_calibration_error(p, y) == pytest.approx(ece)


def _two_gaussians(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Classes 0 and 1, ``N((∓1.5, 0), I)``: the Bayes classifier is the sign of ``x₁``, accuracy ``Φ(1.5) = 0.933``."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 2, (n,), generator=g)
    x = torch.randn(n, 2, generator=g)
    x[:, 0] += 3.0 * y - 1.5
    return x, y


def test_a_short_training_on_two_gaussians_reaches_the_bayes_accuracy_and_their_density():
    x, y = _two_gaussians(2000, 0)
    test_x, test_y = _two_gaussians(2000, 1)
    energy = JointEnergy((2,), 2, hidden=(32, 32), seed=0)
    loss = JointEnergyLoss(n_steps=10, buffer_size=500, sampler_options={"step_size": 0.05}, regularization=0.01)
    Trainer(energy, loss, x, batch_size=128, lr=3e-3, seed=0, labels=y).fit(300)
    with torch.no_grad():
        accuracy = float((energy.logits(test_x).argmax(1) == test_y).float().mean())
        bayes = float(((test_x[:, 0] > 0).long() == test_y).float().mean())
        e = energy.compute_energy(torch.tensor([[-1.5, 0.0], [1.5, 0.0], [0.0, 4.0], [5.0, 4.0]]))
    assert accuracy > bayes - 0.02, (accuracy, bayes)
    assert max(e[0], e[1]) < min(e[2], e[3])  # p(x) is higher at the modes than off the data
    # class-conditional Langevin from the origin walks each chain to its class's side
    labels = torch.tensor([0] * 50 + [1] * 50)
    g = torch.Generator().manual_seed(0)
    samples = sample_classes(energy, labels, torch.zeros(100, 2), 200, sampler_options={"step_size": 0.05}, generator=g)
    assert float((samples[:50, 0] < 0).float().mean()) > 0.8 and float((samples[50:, 0] > 0).float().mean()) > 0.8


def test_labelled_batches_keep_each_row_with_its_label_and_the_unlabelled_order():
    """A loss that records its batches: row ``i`` of the data is ``i``, its label ``i``; the labelled trainer draws the
    rows in the order the unlabelled one does."""

    class Recorder(ContrastiveDivergence):
        needs_labels = True

        def __init__(self):
            super().__init__()
            self.seen = []

        def __call__(self, energy, data, *, labels=None, generator=None):
            self.seen.append((data[:, 0].clone(), labels))
            return energy.compute_energy(data).mean()

    data = torch.arange(10.0)[:, None].repeat(1, 2)
    recorder = Recorder()
    Trainer(_energy().float(), recorder, data, batch_size=4, seed=3, labels=torch.arange(10), watchdog=False).fit(5)
    trainer = Trainer(_energy().float(), ContrastiveDivergence(), data, batch_size=4, seed=3, watchdog=False)
    plain = [trainer.batches.next()[:, 0] for _ in range(5)]
    for (rows, labels), expected in zip(recorder.seen, plain):
        assert torch.equal(rows.long(), labels) and torch.equal(rows, expected)


def test_bad_or_missing_labels_raise_errors_that_name_the_fix():
    energy = _energy(k=3, d=2)
    x = torch.randn(4, 2, dtype=torch.float64)
    loss = JointEnergyLoss(generative_weight=0.0)
    with pytest.raises(InputError, match=r"labels are missing: .*Trainer\(\.\.\., labels=y\)"):
        loss(energy, x)
    with pytest.raises(InputError, match=r"integer class indices \(torch.long\), got torch.float32; .*y.long\(\)"):
        loss(energy, x, labels=torch.zeros(4))
    with pytest.raises(
        InputError, match=r"must be in \[0, 3\) for 3 classes, got values in \[1, 3\] \(labels from 1: use y - 1\)"
    ):
        loss(energy, x, labels=torch.tensor([1, 2, 3, 1]))
    with pytest.raises(InputError, match=r"must have shape \(4,\), one class index per row"):
        loss(energy, x, labels=torch.zeros(4, 1, dtype=torch.long))
    with pytest.raises(InputError, match=r"needs an energy whose logits\(x\)"):
        loss(ebmcore.GaussianEnergy(torch.zeros(2, dtype=torch.float64)), x, labels=torch.zeros(4, dtype=torch.long))
    with pytest.raises(InputError, match=r"JointEnergyLoss needs labels: pass labels=y"):
        Trainer(energy, loss, x)
    with pytest.raises(InputError, match=r"JointEnergyLoss needs labels: .*one per row"):
        Trainer(energy, loss, x, labels=torch.zeros(3, dtype=torch.long))
    with pytest.raises(InputError, match=r"ContrastiveDivergence takes no labels: drop labels="):
        Trainer(energy, ContrastiveDivergence(), x, labels=torch.zeros(4, dtype=torch.long))
    with pytest.raises(InputError, match=r"y must be in \[0, 3\)"):
        ClassConditionalEnergy(energy, 5)
    with pytest.raises(InputError, match=r"n_classes must be an integer ≥ 2"):
        JointEnergy((2,), 1)


def test_a_short_digits_jem_run_writes_the_jem_block(tmp_path, capsys):
    from ebmcore.cli import main
    from loss_problems import shortened_config

    pytest.importorskip("sklearn")
    config = shortened_config(
        "digits_jem",
        [
            ("steps = 3000", "steps = 20"),
            ("ais_chains = 128", "ais_chains = 0"),
            ("image_sample_steps = 500", "image_sample_steps = 5"),
            ("image_samples = 400", "image_samples = 50"),
            ("class_samples = 40", "class_samples = 4"),
            ("class_sample_steps = 200", "class_sample_steps = 5"),
        ],
        tmp_path / "jem.toml",
    )
    out = tmp_path / "run"
    assert main(["train", str(config), "--out", str(out), "--quiet"]) == 0
    report = json.loads((out / "metrics.json").read_text())["jem"]
    assert 0 <= report["ece"] <= 1 and report["ece_bins"] == 15 and report["n_test"] == 297
    assert report["accuracy"] > 0.5  # 20 steps: far from trained, well above chance
    assert len(report["samples"]["per_class_ratio"]) == 10 and report["samples"]["n_steps"] == 5
    assert (out / "class_samples.png").exists() or json.loads((out / "metrics.json").read_text())["plots_skipped"]
    assert "p(y|x): held-out accuracy" in capsys.readouterr().out


@pytest.mark.slow
def test_the_bundled_digits_jem_run_meets_its_targets(tmp_path):
    """The full ``ebm train digits_jem`` (about 2 minutes on 2 cores): held-out accuracy ≥ 97 %, the calibration
    error reported, class-conditional samples recognised as their class ≥ 0.8× as often as real digits."""
    from ebmcore.cli import main

    pytest.importorskip("sklearn")
    out = tmp_path / "jem"
    assert main(["train", "digits_jem", "--out", str(out), "--quiet"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    report = metrics["jem"]
    assert report["accuracy"] >= 0.97
    assert math.isfinite(report["ece"]) and report["ece_bins"] == 15
    assert report["samples"]["ratio"] >= 0.8
    assert metrics["wall_time_s"] < 300


def test_ebm_train_refuses_jem_on_unlabelled_data(tmp_path):
    from ebmcore.errors import ConfigError
    from ebm_losses import train_job
    from loss_problems import shortened_config

    config = shortened_config("digits_jem", [('dataset = "digits"', 'dataset = "eight_gaussians"')], tmp_path / "jem.toml")
    with pytest.raises(ConfigError, match=r'\[loss\] jem trains p\(y\|x\) on labels: set \[data\] dataset = "digits"'):
        train_job.load_config(config)
