"""The feature Fréchet distance (ebm_losses.frechet) against the closed forms of the Fréchet distance between
Gaussians, and on digits against its floor; the pixel-histogram distance (ebm_losses.pixel_histogram) against exact
1-Wasserstein distances, and its saturated and mid-grey judgements."""

import pytest
import torch

from ebmcore.errors import InputError
from ebm_losses import images
from ebm_losses.frechet import feature_frechet, frechet_distance, gaussian_fit, train_feature_classifier
from ebm_losses.pixel_histogram import MID_GREY, SATURATED, pixel_histogram, wasserstein_1d

F64 = torch.float64
A = torch.tensor([[1.0, 0.5, 0.0], [0.5, 2.0, 0.3], [0.0, 0.3, 0.5]], dtype=F64)
B = torch.tensor([[0.6, -0.2, 0.1], [-0.2, 1.0, 0.0], [0.1, 0.0, 1.5]], dtype=F64)  # does not commute with A
MU = torch.tensor([0.5, -0.3, 0.2], dtype=F64)


@pytest.fixture(scope="module")
def digits():
    """``(train, labels, test)``: the bundled configurations' split of the digits, on ``[−1, 1]``."""
    data = images.load("digits")
    x = images.to_model_range(data.images, data.pixel_range)
    train, test = images.split(x, 297, seed=0)
    labels, _ = images.split(data.labels, 297, seed=0)
    return train, labels, test


def test_frechet_distance_matches_its_closed_forms():
    zero = torch.zeros(3, dtype=F64)
    # one dimension: (μa − μb)² + (σa − σb)²
    one = frechet_distance(torch.tensor([1.0]), torch.tensor([[4.0]]), torch.tensor([-0.5]), torch.tensor([[0.25]]))
    assert one == pytest.approx(1.5**2 + (2 - 0.5) ** 2, rel=1e-12)
    # commuting (diagonal) covariances: |Δμ|² + Σ(√a − √b)²
    a, b = torch.tensor([1.0, 4.0, 9.0], dtype=F64), torch.tensor([0.25, 1.0, 16.0], dtype=F64)
    assert frechet_distance(zero, a.diag(), MU, b.diag()) == pytest.approx(
        float(MU.square().sum() + (a.sqrt() - b.sqrt()).square().sum()), rel=1e-12
    )
    # proportional covariances Σb = c²Σa (not diagonal): (1 − c)² tr Σa
    assert frechet_distance(zero, A, zero, 0.09 * A) == pytest.approx(0.49 * float(A.trace()), rel=1e-12)
    assert frechet_distance(MU, A, MU, A) == pytest.approx(0.0, abs=1e-12)
    # symmetric, and unchanged by a rotation of both Gaussians
    q, _ = torch.linalg.qr(torch.randn(3, 3, generator=torch.Generator().manual_seed(0), dtype=F64))
    d = frechet_distance(zero, A, MU, B)
    assert frechet_distance(MU, B, zero, A) == pytest.approx(d, rel=1e-12)
    assert frechet_distance(zero, q @ A @ q.T, q @ MU, q @ B @ q.T) == pytest.approx(d, rel=1e-12)


def test_frechet_distance_equals_the_scipy_sqrtm_formula_for_non_commuting_covariances():
    linalg = pytest.importorskip("scipy.linalg")
    middle = linalg.sqrtm((A @ B).numpy()).real.trace()
    exact = float(MU.square().sum() + A.trace() + B.trace()) - 2 * middle
    assert frechet_distance(torch.zeros(3, dtype=F64), A, MU, B) == pytest.approx(exact, rel=1e-10)


def test_the_estimator_from_samples_converges_to_the_closed_form():
    """200,000 draws of each Gaussian: over 100 replicates the estimate's standard deviation was 2.5/√n (0.0056 at
    this n) and its bias under 0.005; 0.03 is five standard deviations (the exact value is 1.1245)."""
    n, g = 200_000, torch.Generator().manual_seed(1)
    a = torch.randn(n, 3, generator=g, dtype=F64) @ torch.linalg.cholesky(A).T
    b = torch.randn(n, 3, generator=g, dtype=F64) @ torch.linalg.cholesky(B).T + MU
    exact = frechet_distance(torch.zeros(3, dtype=F64), A, MU, B)
    assert exact == pytest.approx(1.1245, abs=1e-4)
    assert frechet_distance(*gaussian_fit(a), *gaussian_fit(b)) == pytest.approx(exact, abs=0.03)


def test_bad_shapes_are_input_errors():
    with pytest.raises(InputError, match=r"means \(k,\) and covariances \(k, k\)"):
        frechet_distance(torch.zeros(3), torch.eye(3), torch.zeros(2), torch.eye(2))
    with pytest.raises(InputError, match=r"shape \(n, k\) with n ≥ 2"):
        gaussian_fit(torch.zeros(1, 4))
    with pytest.raises(InputError, match="one label per image"):
        train_feature_classifier(torch.zeros(5, 1, 2, 2), torch.zeros(4))
    with pytest.raises(InputError, match="class indices"):
        train_feature_classifier(torch.zeros(2, 1, 2, 2), torch.tensor([0, -1]))
    with pytest.raises(InputError, match="1 of 3 feature vectors are not finite"):
        gaussian_fit(torch.tensor([[0.0, 1.0], [float("nan"), 0.0], [1.0, 1.0]]))


def test_real_digits_score_the_floor_and_noise_and_a_collapse_score_far_above_it(digits):
    """Digits the classifiers never saw are real data: their distance from the held-out digits is about the floor
    (measured 5.5 against a floor of 7.0, 5.8–8.3 over the three reserves; a single value's noise at n = 297).
    With two classifiers, uniform noise measured 59× the floor, the 156 threes alone (a collapse) 19×."""
    train, labels, test = digits
    keep, unseen = slice(300, None), slice(0, 300)
    real = feature_frechet(train[unseen], train[keep], labels[keep], test, folds=3)
    assert real["feature_frechet_n"] == 297 and real["feature_classifier_accuracy"] > 0.9
    low, high = real["feature_frechet_floor_range"]
    assert 0 < low <= real["feature_frechet_floor"] <= high
    assert real["feature_frechet_distance"] < 1.5 * real["feature_frechet_floor"]
    assert "not Inception FID" in real["feature_extractor"]
    noise = torch.rand(300, 1, 8, 8, generator=torch.Generator().manual_seed(0)) * 2 - 1
    assert feature_frechet(noise, train, labels, test, folds=2)["feature_frechet_ratio"] > 10
    threes = train[labels == 3]  # all one class: a collapse onto one mode
    collapsed = feature_frechet(threes, train, labels, test, folds=2)
    assert collapsed["feature_frechet_n"] == len(threes) and collapsed["feature_frechet_ratio"] > 5


def test_feature_frechet_is_deterministic_given_its_seed_and_says_what_it_needs(digits):
    train, labels, test = digits
    first, second = (feature_frechet(test[:40], train[:200], labels[:200], test, folds=2, seed=3) for _ in range(2))
    assert first == second
    with pytest.raises(InputError, match="one label per training image"):
        feature_frechet(test, train, labels[:10], test)
    with pytest.raises(InputError, match="at least 2 folds"):
        feature_frechet(test, train, labels, test, folds=1)


def test_wasserstein_1d_is_exact_on_shifts_point_masses_and_against_scipy():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1000, generator=g, dtype=F64)
    assert wasserstein_1d(x, x + 0.3) == pytest.approx(0.3, rel=1e-12)  # a shift moves every quantile by c
    assert wasserstein_1d(torch.zeros(3), torch.ones(7)) == pytest.approx(1.0)
    assert wasserstein_1d(torch.tensor([0.0, 1.0]), torch.zeros(5)) == pytest.approx(0.5)  # half the mass moves 1
    stats = pytest.importorskip("scipy.stats")
    y = torch.rand(777, generator=g, dtype=F64)
    assert wasserstein_1d(x, y) == pytest.approx(stats.wasserstein_distance(x.numpy(), y.numpy()), rel=1e-12)


def test_pixel_histogram_passes_real_digits_and_flags_the_issues_saturated_samples(digits):
    train, _, test = digits
    real = pixel_histogram(train[:400], train[400:], test)
    assert real["pixel_fractions_ok"] and real["pixel_warnings"] == []
    # 297 digits × 64 pixels: the held-out fractions are those of all digits (9.1 % saturated, 23 % mid grey)
    assert real["saturated_fraction_data"] == pytest.approx(0.091, abs=0.01)
    assert real["mid_grey_fraction_data"] == pytest.approx(0.23, abs=0.02)
    assert 0.8 < real["saturated_ratio"] < 1.25 and 0.8 < real["mid_grey_ratio"] < 1.25
    assert real["pixel_wasserstein"] < 3 * real["pixel_wasserstein_floor"] + 0.005
    # issue 39's digits_eqm samples: strokes pushed past white (x → 1.5x + 0.3, clipped) saturate, the grey band thins
    saturated = pixel_histogram(1.5 * train[:400] + 0.3, train[400:], test)
    assert not saturated["pixel_fractions_ok"] and saturated["saturated_ratio"] > 1.5 and saturated["mid_grey_ratio"] < 1 / 1.5
    assert [line.split(" pixels")[0] for line in saturated["pixel_warnings"]] == ["saturated", "mid-grey"]
    assert saturated["pixel_wasserstein"] > 10 * real["pixel_wasserstein"]


def test_pixel_bands_count_clipped_overshoot_as_saturated():
    data = torch.tensor([-1.0, 0.0, 1.0, 1.0]).reshape(1, 1, 2, 2)  # 50 % saturated, 25 % mid grey
    samples = torch.tensor([-1.0, MID_GREY, 1.7, SATURATED - 1e-6]).reshape(1, 1, 2, 2)  # 1.7 clips to 1
    report = pixel_histogram(samples, data, data)
    assert report["saturated_fraction_samples"] == 0.25 and report["saturated_ratio"] == 0.5
    assert report["mid_grey_fraction_samples"] == 0.25 and report["mid_grey_ratio"] == 1.0
    assert report["pixel_warnings"] == [
        "saturated pixels (x ≥ 0.9375): 25.0% of sample pixels against 50.0% of held-out pixels "
        "(0.50×, outside 0.67–1.5× the data's)"
    ]
    with pytest.raises(InputError, match="images of one shape"):
        pixel_histogram(samples.reshape(1, 4), data, data)
    broken = pixel_histogram(torch.tensor([float("nan"), 0.0, 1.0, float("inf")]).reshape(1, 1, 2, 2), data, data)
    assert broken["pixel_warnings"] == ["1 of 4 sample pixels are NaN: left out of the histogram"]
    assert broken["saturated_ratio"] == 1.0 and broken["mid_grey_ratio"] == 1.0 and not broken["pixel_fractions_ok"]
    assert broken["pixel_wasserstein"] == pytest.approx(5 / 12)  # {0, 1, 1} (inf clipped to 1) against {−1, 0, 1, 1}


def test_the_summary_shows_each_number_beside_what_real_data_scores():
    from ebm_losses.train_report import _sample_quality_lines

    data = torch.tensor([-1.0, 0.0, 1.0, 1.0]).reshape(1, 1, 2, 2)
    quality = pixel_histogram(torch.tensor([-1.0, 0.5, 1.7, 0.9]).reshape(1, 1, 2, 2), data, data)
    quality.update(
        feature_frechet_distance=14.0,
        feature_frechet_floor=7.0,
        feature_frechet_floor_range=[5.5, 8.5],
        feature_frechet_ratio=2.0,
        feature_frechet_n=297,
    )
    fd, pixels, warning = _sample_quality_lines(quality)
    assert fd.startswith("  samples: feature Fréchet distance 14.00, 2.00× real data's 7.00 (5.50–8.50 over its reserves")
    assert "not Inception FID" in fd
    assert pixels.startswith("  pixels: histogram distance (W1) ") and pixels.endswith("NOT within 1.5× of the data's")
    assert "saturated 25.0% (data 50.0%, 0.50×), mid grey 25.0% (data 25.0%, 1.00×)" in pixels
    assert warning == "  warning: " + quality["pixel_warnings"][0]
