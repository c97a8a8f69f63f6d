"""The pixel-value histogram of image samples against the data's: a distance that sees saturation, which a classifier
and a pairwise spread do not, and the fractions of saturated and mid-grey pixels judged against the data's.

All images are on the model range ``[−1, 1]``; samples are clipped to it first, as the pictures show them, so a
sample that overshoots the range counts as saturated."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ebmcore.errors import InputError

__all__ = ["SATURATED", "MID_GREY", "TOLERANCE", "wasserstein_1d", "pixel_histogram"]

SATURATED = 15 / 16
"""A pixel at or above this is saturated: the top 1/32 of ``[−1, 1]`` (digits, 0–16: the top level, 16)."""

MID_GREY = 0.5
"""A pixel with ``|x| ≤`` this is mid grey: the middle half of ``[−1, 1]`` (digits: levels 4 to 12)."""

TOLERANCE = 1.5
"""The samples' fraction of saturated, and of mid-grey, pixels is judged ok within this factor of the data's."""


def wasserstein_1d(a: Tensor, b: Tensor) -> float:
    """The 1-Wasserstein distance ``∫|F_a − F_b|`` between the empirical distributions of the values ``a: (n,)`` and
    ``b: (m,)`` (any shapes, flattened), exact, in float64."""
    a, b = a.detach().flatten().double().cpu(), b.detach().flatten().double().cpu()
    if not len(a) or not len(b):
        raise InputError(f"wasserstein_1d needs values on both sides, got {len(a)} and {len(b)}.")
    a, b = a.sort().values, b.sort().values
    points = torch.cat([a, b]).sort().values
    cdf_a = torch.searchsorted(a, points[:-1], right=True).double() / len(a)
    cdf_b = torch.searchsorted(b, points[:-1], right=True).double() / len(b)
    return float(((cdf_a - cdf_b).abs() * points.diff()).sum())


def _band(name: str, samples: float, data: float, tolerance: float, where: str) -> tuple[dict[str, Any], list[str]]:
    """One band's fractions, ratio and judgement, and a warning line when it is out of ``tolerance``."""
    ratio = samples / data if data > 0 else None
    ok = samples == 0 if ratio is None else 1 / tolerance <= ratio <= tolerance
    record = {f"{name}_fraction_samples": samples, f"{name}_fraction_data": data, f"{name}_ratio": ratio}
    if ok:
        return record, []
    how = "n/a" if ratio is None else f"{ratio:.2f}×"
    line = (
        f"{name.replace('_', '-')} pixels ({where}): {samples:.1%} of sample pixels against {data:.1%} of held-out "
        f"pixels ({how}, outside {1 / tolerance:.2g}–{tolerance:g}× the data's)"
    )
    return record, [line]


def pixel_histogram(samples: Tensor, train: Tensor, test: Tensor, *, tolerance: float = TOLERANCE) -> dict[str, Any]:
    """How the pixel values of ``samples: (n, *shape)`` (clipped to ``[−1, 1]``) compare with the held-out ``test``:

    - ``pixel_wasserstein``: the 1-Wasserstein distance between their pixel-value distributions (in units of the
      model range), beside ``pixel_wasserstein_floor``, the same for ``min(n, len(train))`` training images: what
      real images score. Continuous samples of data quantised to few levels score up to a quarter of the levels'
      spacing even when they sit within each level's bin (digits, 17 levels: 1/32 ≈ 0.03), which no picture shows;
    - ``saturated_fraction_*``: pixels at or above :data:`SATURATED`, ``mid_grey_fraction_*``: ``|x| ≤``
      :data:`MID_GREY`, of the samples and the data, with their ratio; ``pixel_fractions_ok`` is True when both
      ratios are within ``tolerance``× (either way), else ``pixel_warnings`` says which is not (and whether sample
      pixels were NaN: they count in neither band, and are left out of the distance)."""
    if samples.shape[1:] != test.shape[1:] or train.shape[1:] != test.shape[1:]:
        raise InputError(
            f"samples, train and test must be images of one shape, got {tuple(samples.shape)}, {tuple(train.shape)} "
            f"and {tuple(test.shape)}."
        )
    if tolerance < 1:
        raise InputError(f"tolerance is a factor of at least 1, got {tolerance}.")
    s = samples.detach().double().cpu().clamp(-1, 1)  # ±inf clip to the ends; NaN stays, and is left out below
    t, r = test.detach().double().cpu(), train.detach().double().cpu()[: len(samples)]
    nan = s.isnan()
    report: dict[str, Any] = {
        "pixel_wasserstein": wasserstein_1d(s[~nan], t) if not bool(nan.all()) else None,
        "pixel_wasserstein_floor": wasserstein_1d(r, t),
        "pixel_bands": f"saturated: x ≥ {SATURATED:g}; mid grey: |x| ≤ {MID_GREY:g} (on [−1, 1], samples clipped)",
    }
    warnings = [f"{int(nan.sum())} of {nan.numel()} sample pixels are NaN: left out of the histogram"] if nan.any() else []
    for name, where, inside in (
        ("saturated", f"x ≥ {SATURATED:g}", lambda x: x >= SATURATED),
        ("mid_grey", f"|x| ≤ {MID_GREY:g}", lambda x: x.abs() <= MID_GREY),
    ):
        record, lines = _band(name, float(inside(s).double().mean()), float(inside(t).double().mean()), tolerance, where)
        report.update(record)
        warnings += lines
    report["pixel_tolerance"] = tolerance
    report["pixel_fractions_ok"] = not warnings
    report["pixel_warnings"] = warnings
    return report
