"""What ``ebm train`` reports for a joint energy model (``jem``): held-out accuracy, expected calibration error, and
class-conditional samples judged by an independent classifier against real digits of each class."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ebmcore import EnergyModel
from ebmcore.errors import InputError
from ebm_losses.jem import check_labels, sample_classes

__all__ = ["ECE_BINS", "expected_calibration_error", "class_recognition", "jem_report", "summary_lines"]

ECE_BINS = 15
"""Equal-width confidence bins of the expected calibration error (Guo et al. 2017 use 15)."""


def expected_calibration_error(probabilities: Tensor, labels: Tensor, n_bins: int = ECE_BINS) -> float:
    """``Σ_b (|B_b|/n)·|accuracy(B_b) − confidence(B_b)|`` over ``n_bins`` equal-width bins ``((b−1)/n_bins, b/n_bins]``
    of the confidence ``max_y p(y|x)``; ``probabilities: (n, K)``, ``labels: (n,)``."""
    if probabilities.dim() != 2:
        raise InputError(f"probabilities must be (n, K), got shape {tuple(probabilities.shape)}.")
    labels = check_labels(labels, probabilities.shape[0], probabilities.shape[1])
    confidence, predicted = probabilities.double().max(1)
    correct = (predicted == labels.to(predicted.device)).double()
    bins = (confidence * n_bins).ceil().long().clamp(1, n_bins) - 1  # (b−1)/n_bins < c ≤ b/n_bins
    n = torch.bincount(bins, minlength=n_bins).double()
    gap = torch.bincount(bins, correct - confidence, minlength=n_bins)  # Σ (correct − confidence) per bin
    return float(gap.abs().sum() / n.sum())


def class_recognition(
    samples: Tensor, sample_labels: Tensor, train: Tensor, train_labels: Tensor, test: Tensor, test_labels: Tensor, seed: int = 0
) -> dict[str, Any]:
    """How often class-conditional ``samples`` (clipped to ``[−1, 1]``) are classified as their ``sample_labels`` by
    the independent classifier of :func:`~ebm_losses.image_report.classifier_quality` (logistic regression on the
    training pixels), per class and relative to the held-out images ``test`` of that class: ``ratio`` is the mean
    over classes of the samples' rate over the mean of the real images' (1: as recognisable as real digits).
    ``spread`` is the samples' mean pairwise distance within a class over the real images' (mean over classes; 1: as
    varied as the data, near 0: one template per class, as a plain classifier's saturated samples are), and
    ``outside_range`` the fraction of sample pixels outside ``[−1, 1]`` before clipping."""
    try:
        from sklearn.linear_model import LogisticRegression
    except ImportError:
        raise InputError("the classifier check needs scikit-learn: pip install 'ebm-losses[images]'.") from None
    clf = LogisticRegression(max_iter=2000, random_state=seed).fit(
        train.flatten(1).double().cpu().numpy(), train_labels.cpu().numpy()
    )
    predicted = torch.from_numpy(clf.predict(samples.flatten(1).double().clamp(-1, 1).cpu().numpy()))
    real = torch.from_numpy(clf.predict(test.flatten(1).double().cpu().numpy()))
    sample_labels, test_labels = sample_labels.cpu(), test_labels.cpu()
    classes = sorted(set(sample_labels.tolist()) & set(test_labels.tolist()))
    rate = lambda p, y, c: float((p[y == c] == c).double().mean())  # noqa: E731
    per_samples = [rate(predicted, sample_labels, c) for c in classes]
    per_real = [rate(real, test_labels, c) for c in classes]
    mean_samples, mean_real = sum(per_samples) / len(classes), sum(per_real) / len(classes)
    flat, real_flat = samples.flatten(1).double().clamp(-1, 1).cpu(), test.flatten(1).double().cpu()
    pairwise = lambda z: float(torch.pdist(z).mean()) if len(z) > 1 else float("nan")  # noqa: E731
    spreads = [pairwise(flat[sample_labels == c]) / pairwise(real_flat[test_labels == c]) for c in classes]
    return {
        "ratio": mean_samples / mean_real if mean_real else None,
        "recognised_samples": mean_samples,
        "recognised_test": mean_real,
        "classes": classes,
        "per_class_samples": per_samples,
        "per_class_test": per_real,
        "per_class_ratio": [s / r if r else None for s, r in zip(per_samples, per_real)],
        "spread": sum(spreads) / len(spreads),
        "outside_range": float((samples.abs() > 1).double().mean()),
        "classifier": "logistic regression on the training split's pixels (scikit-learn), samples clipped to [-1, 1]",
    }


def jem_report(
    energy: EnergyModel,
    loss: Any,
    train: Tensor,
    train_labels: Tensor,
    test: Tensor,
    test_labels: Tensor,
    out: Path | None,
    pixel_range: tuple[float, float] = (-1.0, 1.0),
    plots: bool = True,
    n_per_class: int = 40,
    n_steps: int = 200,
    seed: int = 0,
) -> dict[str, Any]:
    """The ``jem`` block of ``metrics.json``: ``accuracy`` and ``ece`` (:data:`ECE_BINS` bins) of ``p(y|x)`` on
    ``test``, its mean held-out cross-entropy ``nll``, and ``samples``: :func:`class_recognition` of ``n_per_class``
    class-conditional samples per class (:func:`~ebm_losses.jem.sample_classes`: ``n_steps`` of the loss's sampler
    on ``E(x, y)`` from uniform noise on ``[−1, 1]``). With ``plots`` and ``out``, ``class_samples.png``: one row
    per class."""
    with torch.no_grad():
        logits = torch.cat([energy.logits(chunk) for chunk in test.split(1024)])
    k = logits.shape[1]
    y = check_labels(test_labels, len(test), k, what="test labels").to(logits.device)
    g = torch.Generator(device=train.device).manual_seed(seed)
    labels = torch.arange(k, device=train.device).repeat_interleave(n_per_class)
    start = torch.rand((len(labels), *train.shape[1:]), generator=g, device=train.device, dtype=train.dtype) * 2 - 1
    spec = getattr(loss, "sampler_spec", "langevin")
    options = dict(getattr(loss, "sampler_options", {})) if isinstance(spec, str) else {}
    samples = sample_classes(
        energy,
        labels,
        start,
        n_steps,
        sampler=spec if isinstance(spec, str) else "langevin",
        sampler_options=options,
        generator=g,
    )
    report = {
        "accuracy": float((logits.argmax(1) == y).double().mean()),
        "ece": expected_calibration_error(torch.softmax(logits, 1), y),
        "ece_bins": ECE_BINS,
        "nll": float(torch.nn.functional.cross_entropy(logits.double(), y)),
        "n_test": len(test),
        "samples": {
            "n_per_class": n_per_class,
            "n_steps": n_steps,
            "sampler": spec if isinstance(spec, str) else "langevin",
            "sampler_options": options,
            "start": "uniform noise on [-1, 1]",
            **class_recognition(samples, labels, train, train_labels, test, test_labels, seed=seed),
        },
    }
    if plots and out is not None:
        from ebm_losses import images
        from ebm_losses.image_report import plot_image_grid

        columns = min(n_per_class, 10)
        rows = samples.view(k, n_per_class, *samples.shape[1:])[:, :columns].reshape(-1, *samples.shape[1:])
        plot_image_grid(
            Path(out) / "class_samples.png",
            images.to_pixel_range(rows, pixel_range),
            pixel_range,
            f"{n_steps} steps of {report['samples']['sampler']} on E(x, y), one row per class",
            columns=columns,
        )
    return report


def summary_lines(report: dict[str, Any] | None) -> list[str]:
    """The ``ebm train`` summary's line on a ``jem`` block (none without one)."""
    if not report:
        return []
    samples = report["samples"]
    ratio = "n/a" if samples["ratio"] is None else f"{samples['ratio']:.2f}"
    return [
        f"  p(y|x): held-out accuracy {report['accuracy']:.1%}, ECE {report['ece']:.3f} ({report['ece_bins']} bins), "
        f"NLL {report['nll']:.3f}; class-conditional samples recognised as their class {samples['recognised_samples']:.0%} "
        f"(held-out digits {samples['recognised_test']:.0%}): ratio {ratio}, spread {samples['spread']:.2f}"
    ]
