"""What ``ebm train`` writes for an image model: a grid of images and energy histograms (PNG, matplotlib's Agg
backend, through :mod:`ebmcore.plotting`), and the AIS estimate of the held-out log-likelihood."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import Tensor

from ebmcore import EnergyModel
from ebmcore.errors import InputError
from ebmcore.plotting import pyplot, save_figure

__all__ = [
    "plot_image_grid",
    "plot_energy_histograms",
    "ais_log_likelihood",
    "sample_quality",
    "classifier_quality",
    "image_report",
    "CONFIDENCE",
]


def plot_image_grid(path: Path, images: Tensor, pixel_range: tuple[float, float], title: str, columns: int = 10) -> None:
    """Up to ``columns²`` images ``(N, C, H, W)`` (on ``pixel_range``, clipped to it) in a square grid."""
    plt = pyplot()
    images = images.detach().float().cpu()[: columns * columns].clamp(*pixel_range)
    n, c, h, w = images.shape
    rows = math.ceil(n / columns)
    canvas = torch.full((c, rows * (h + 1) + 1, columns * (w + 1) + 1), float(pixel_range[1]))
    for i in range(n):
        r, q = divmod(i, columns)
        canvas[:, 1 + r * (h + 1) : 1 + r * (h + 1) + h, 1 + q * (w + 1) : 1 + q * (w + 1) + w] = images[i]
    fig, ax = plt.subplots(figsize=(6, 6 * rows / columns + 0.4))
    low, high = pixel_range
    if c == 1:  # dark strokes on a light background, as digits are drawn
        ax.imshow(canvas[0].numpy(), cmap="gray_r", vmin=low, vmax=high, interpolation="nearest")
    else:
        ax.imshow(((canvas - low) / (high - low)).permute(1, 2, 0).numpy(), interpolation="nearest")
    ax.set_axis_off()
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    save_figure(fig, path)


def plot_energy_histograms(path: Path, energies: Sequence[tuple[str, Tensor]], title: str) -> None:
    """Overlaid histograms of ``E`` for each ``(label, energies)``: data against samples."""
    plt = pyplot()
    values = [(label, e.detach().double().cpu()) for label, e in energies]
    everything = torch.cat([v for _, v in values])
    low, high = float(everything.quantile(0.005)), float(everything.quantile(0.995))
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, v in values:
        ax.hist(v.clamp(low, high).numpy(), bins=50, range=(low, high), alpha=0.5, density=True, label=label)
    ax.set_xlabel("energy E(x)")
    ax.set_ylabel("density")
    ax.set_title(title, fontsize=10)
    ax.legend()
    fig.tight_layout()
    save_figure(fig, path)


def ais_log_likelihood(
    energy: EnergyModel,
    train: Tensor,
    test: Tensor,
    *,
    n_chains: int,
    n_temperatures: int,
    seed: int,
    bounds: tuple[float, float] | None = None,
    base: tuple[Tensor, Tensor] | None = None,
    exact_base: Any = None,
    min_scale: float = 0.1,
    min_ess_fraction: float = 0.1,
    check_temperatures: int | None = None,
) -> dict[str, Any]:
    """Held-out mean ``log p(x) = −E(x) − log Z`` (nats per example, and per dimension) with ``log Z`` from AIS
    (:func:`ebm_samplers.ais.estimate_log_z`): from ``base = (loc: (d,), scale_tril: (d, d))``, a full-covariance
    Gaussian (an energy's own fitted base, ``ais_base()``; the density on all of ``R^d``; with ``exact_base``, the
    energy's own ``exact_base()`` in that Gaussian's whitened coordinates, such as a fitted mixture, the chains start
    from it and anneal from its energy), else on the box ``bounds``
    (images: the density restricted to ``[−1, 1]^d``), else from the base ``N(mean, std²)`` of ``train`` per
    dimension, std at least ``min_scale``; ``domain`` says which. Its standard error is
    that of ``log Z`` (the test mean's own is ``test_mean_se``).

    ``reliable`` is True only when the estimator's own checks pass (``checks``): the weights' effective sample size
    is at least ``min_ess_fraction`` of the chains (below it the delta-method error is itself unreliable), and a
    second AIS run with ``check_temperatures`` temperatures (default half as many; 0: no second run) agrees within
    the combined errors (:func:`ebm_losses.likelihood.compare`, which warns when it does not; the record is in
    ``warnings``). A failed ESS check adds a record to ``warnings`` too (``quantity``, ``effective_sample_size``,
    ``threshold``, ``message``: why, and what to raise). Neither check can see a mode that no chain visits: with one, both pass and ``reliable`` is True
    for a ``log Z`` that is too low (:class:`ebm_samplers.AISResult`); only another estimate (the grid of 2-d runs)
    catches it."""
    from ebm_samplers.ais import estimate_log_z
    from ebm_losses.likelihood import compare

    generator = torch.Generator(device=train.device).manual_seed(seed)
    if base is not None:
        where: dict[str, Any] = {"loc": base[0], "scale_tril": base[1], "base": exact_base}
        fitted = "fitted Gaussian base" if exact_base is None else "own exact base in its Gaussian's whitened coordinates"
        domain = f"R^{test[0].numel()}, annealed from the model's {fitted}"
    elif bounds is not None:
        where, domain = {"bounds": bounds}, f"the box [{bounds[0]:g}, {bounds[1]:g}]^{test[0].numel()}, from its uniform density"
    else:
        where = {"loc": train.mean(0), "scale": train.std(0).clamp_min(min_scale)}
        domain = f"R^{test[0].numel()}, annealed from a diagonal Gaussian of the training data"
    run = lambda k: estimate_log_z(
        energy,
        n_chains,
        k,
        event_shape=tuple(train.shape[1:]),  # noqa: E731
        generator=generator,
        **where,
    )
    result = run(n_temperatures)
    with torch.no_grad():
        e = torch.cat([energy.compute_energy(chunk) for chunk in test.split(1024)]).double()
    d = test[0].numel()
    mean = float(-e.mean()) - result.log_z
    threshold = min_ess_fraction * n_chains
    checks: dict[str, Any] = {
        "ess": {
            "effective_sample_size": result.effective_sample_size,
            "threshold": threshold,
            "passed": result.effective_sample_size >= threshold,
        }
    }
    records = []
    if not checks["ess"]["passed"]:
        ess = result.effective_sample_size
        records.append(
            {
                "quantity": "held-out log-likelihood by AIS",
                "effective_sample_size": ess,
                "threshold": threshold,
                "message": (
                    f"held-out log-likelihood by AIS: not reliable, the importance weights' effective sample size "
                    f"is {ess:.1f} of {n_chains} chains (at least {threshold:g} needed): a few chains carry all "
                    "the weight, so the estimate and its standard error are both unreliable (log Z is likely too "
                    "low). Raise [output] ais_chains and ais_temperatures, or anneal from a base closer to the "
                    "model (an energy with a fitted Gaussian base, as gaussian_residual in ebm train "
                    "digits_density)."
                ),
            }
        )
    k = n_temperatures // 2 if check_temperatures is None else check_temperatures
    if k:
        second = run(k)
        other = float(-e.mean()) - second.log_z
        record = compare(
            "held-out log-likelihood by AIS",
            (f"{n_temperatures} temperatures", mean, result.standard_error),
            (f"{k} temperatures", other, second.standard_error),
            note="AIS has not converged: raise [output] ais_temperatures (and ais_chains).",
        )
        checks["temperatures"] = {
            "n_temperatures": k,
            "test_log_likelihood": other,
            "standard_error": second.standard_error,
            "effective_sample_size": second.effective_sample_size,
            "passed": record is None,
        }
        records += [record] if record else []
    return {
        "test_log_likelihood": mean,
        "test_log_likelihood_per_dim": mean / d,
        "standard_error": result.standard_error,
        "test_mean_se": float(e.std() / math.sqrt(len(e))),
        "reliable": all(check["passed"] for check in checks.values()),
        "checks": checks,
        "warnings": records,
        "domain": domain,
        "log_z": result.summary(),
    }


def _nearest(queries: Tensor, reference: Tensor) -> tuple[Tensor, Tensor]:
    """RMS distance per pixel to the nearest ``reference`` image, and its index: ``(n,)`` each."""
    q, r = queries.flatten(1).double(), reference.flatten(1).double()
    distances = torch.cat([torch.cdist(chunk, r) for chunk in q.split(512)])
    best, index = distances.min(1)
    return best / math.sqrt(q.shape[1]), index


def sample_quality(samples: Tensor, train: Tensor, test: Tensor, labels: Tensor | None) -> dict[str, Any]:
    """Sample-quality measures on the model range: the RMS distance from each sample to its nearest training image
    (against the same for held-out images: much smaller means copies, much larger means off the data), the pixel
    mean and std of samples and data (before clipping), the pixel-value histogram against the data's with the
    saturated and mid-grey fractions (:func:`ebm_losses.pixel_histogram.pixel_histogram`, on clipped samples), and
    with ``labels`` (of ``train``) the class counts of the samples' nearest training images (how many classes the
    samples cover)."""
    from ebm_losses.pixel_histogram import pixel_histogram

    d_samples, index = _nearest(samples, train)
    d_test, _ = _nearest(test, train)
    report: dict[str, Any] = {
        "nearest_train_rms_samples": float(d_samples.mean()),
        "nearest_train_rms_test": float(d_test.mean()),
        "pixel_mean_samples": float(samples.mean()),
        "pixel_mean_data": float(test.mean()),
        "pixel_std_samples": float(samples.std()),
        "pixel_std_data": float(test.std()),
    }
    if labels is not None:
        counts = torch.bincount(labels.to(index.device)[index].long(), minlength=int(labels.max()) + 1)
        report["nearest_train_class_counts"] = counts.tolist()
        report["classes_covered"] = int((counts > 0).sum())
    report.update(pixel_histogram(samples, train, test))
    return report


CONFIDENCE = 0.9
"""A classifier's prediction counts as confident at this probability or above."""


def classifier_quality(
    samples: Tensor, train: Tensor, train_labels: Tensor, test: Tensor, *, confidence: float = CONFIDENCE, seed: int = 0
) -> dict[str, Any]:
    """How recognisable and how varied labelled-image ``samples`` are, by a logistic-regression classifier (scikit-learn)
    trained on ``train: (n, *shape)`` with ``train_labels: (n,)``, all on the model range ``[−1, 1]``:

    - ``classifier_ratio``: the fraction of samples classified with probability ≥ ``confidence``, divided by the same
      fraction for the held-out images ``test`` (1: as recognisable as real data);
    - ``confident_classes``: how many classes the confident samples fall in, with their ``confident_class_counts``;
    - ``spread``: the samples' mean pairwise distance over the held-out images' (1: as varied as the data; much
      less: the samples collapsed onto a few images).

    Samples are clipped to ``[−1, 1]`` first, as the pictures show them."""
    try:
        from sklearn.linear_model import LogisticRegression
    except ImportError:
        raise InputError("the classifier check needs scikit-learn: pip install 'ebm-losses[images]'.") from None
    x = train.flatten(1).double().cpu().numpy()
    clf = LogisticRegression(max_iter=2000, random_state=seed).fit(x, train_labels.cpu().numpy())
    s = samples.flatten(1).double().clamp(-1, 1).cpu()
    t = test.flatten(1).double().cpu()
    p_samples, p_test = clf.predict_proba(s.numpy()), clf.predict_proba(t.numpy())
    confident = p_samples.max(1) >= confidence
    fraction_samples, fraction_test = float(confident.mean()), float((p_test.max(1) >= confidence).mean())
    classes = clf.classes_[p_samples.argmax(1)][confident]
    counts = [int((classes == c).sum()) for c in clf.classes_]
    pairwise = lambda z: float(torch.pdist(z).mean())  # noqa: E731
    return {
        "classifier_ratio": fraction_samples / fraction_test if fraction_test else None,
        "confident_fraction_samples": fraction_samples,
        "confident_fraction_test": fraction_test,
        "confidence": confidence,
        "confident_classes": sum(c > 0 for c in counts),
        "confident_class_counts": counts,
        "spread": pairwise(s) / pairwise(t),
        "classifier": "logistic regression on the training split's pixels (scikit-learn)",
    }


def image_report(
    energy: EnergyModel,
    loss: Any,
    train: Tensor,
    test: Tensor,
    pixel_range: tuple[float, float],
    out: Path,
    *,
    plots: bool,
    n_steps: int,
    ais_chains: int,
    ais_temperatures: int,
    seed: int,
    labels: Tensor | None = None,
    n_samples: int = 100,
    sampler: str | None = None,
    sampler_params: dict[str, Any] | None = None,
    denoise: bool = False,
) -> dict[str, Any]:
    """Fresh samples of the trained ``energy`` (``n_steps`` of the loss's sampler from its noise, or from uniform noise
    on ``[−1, 1]``) written to ``samples.pt``/``.npz`` on ``pixel_range``; with ``plots``: ``samples.png``,
    ``buffer.png`` (a PCD replay buffer), ``data.png`` and ``energy_histogram.png``; returns the metrics: sample
    quality (:func:`sample_quality`; with ``labels`` of ``train`` also :func:`classifier_quality` and the feature
    Fréchet distance, :func:`ebm_losses.frechet.feature_frechet`), mean energies, and
    the AIS held-out log-likelihood (``ais_chains > 0``).

    A loss with a ``generate(energy, n, like, generator)`` method (``equilibrium_matching``) draws the samples
    itself. A loss without a sampler of its own (score matching) is sampled with the registered ``sampler`` and its
    ``sampler_params``; one with a schedule (``annealed_langevin``) runs its whole schedule, and ``denoise`` then
    adds the final denoising step at its last level (:func:`ebm_losses.noise_conditional.denoise`)."""
    from ebmcore import registry, runfiles
    from ebm_losses import images
    from ebm_losses.noise_conditional import denoise as denoising_step

    device = train.device
    g = torch.Generator(device=device).manual_seed(seed)
    noise = getattr(loss, "_noise", None)
    if noise is not None and getattr(loss, "noise_location", None) is not None:
        x0 = noise(n_samples, train, g)
    else:
        x0 = torch.rand((n_samples, *train.shape[1:]), generator=g, device=device, dtype=train.dtype) * 2 - 1
    spec = getattr(loss, "sampler_spec", None)
    own = callable(getattr(loss, "generate", None))  # a loss with its own generation procedure (EqM's descent)
    if own:
        spec, options = f"{type(loss).__name__}.generate", {}
    elif spec is not None:
        options = dict(getattr(loss, "sampler_options", {})) if isinstance(spec, str) else {}
    else:
        spec, options = sampler or "langevin", dict(sampler_params or {})
    if own:
        chains, samples = None, loss.generate(energy, n_samples, train, g).detach()
        n_steps = getattr(loss, "sample_steps", n_steps)
    else:
        chains = registry.get("sampler", spec if isinstance(spec, str) else "langevin")(energy, **options)
        n_steps = getattr(chains, "total_steps", n_steps)  # a schedule runs whole
        samples = chains.sample(x0, n_steps, generator=g).detach() if n_steps else x0
    if denoise:
        sigmas = getattr(chains, "options", {}).get("sigmas")
        if not sigmas:
            raise InputError(
                f"denoise needs a sampler with noise levels (annealed_langevin), not {spec!r}; "
                "set [output] denoise = false or sampler = \"annealed_langevin\"."
            )
        samples = denoising_step(energy, samples, sigmas[-1])
    runfiles.save_samples(out, "samples", images.to_pixel_range(samples, pixel_range))
    buffer = getattr(loss, "buffer", None)
    with torch.no_grad():
        e_test, e_samples = energy.compute_energy(test).double(), energy.compute_energy(samples).double()
        e_buffer = None if buffer is None else energy.compute_energy(buffer[: len(test)]).double()
    if plots:
        plot_image_grid(
            out / "samples.png",
            images.to_pixel_range(samples, pixel_range),
            pixel_range,
            f"{n_steps} steps of {spec if isinstance(spec, str) else 'the sampler'} from noise"
            + (", then a denoising step" if denoise else ""),
        )
        plot_image_grid(out / "data.png", images.to_pixel_range(test, pixel_range), pixel_range, "held-out data")
        curves = [("held-out data", e_test), ("fresh samples", e_samples)]
        if buffer is not None:
            plot_image_grid(out / "buffer.png", images.to_pixel_range(buffer, pixel_range), pixel_range, "replay buffer")
            curves.append(("replay buffer", e_buffer))
        plot_energy_histograms(out / "energy_histogram.png", curves, "energies of data and samples")
    metrics: dict[str, Any] = {
        "image_shape": list(train.shape[1:]),
        "pixel_range": list(pixel_range),
        "model_range": [-1.0, 1.0],
        "mean_energy_test": float(e_test.mean()),
        "mean_energy_samples": float(e_samples.mean()),
        "mean_energy_buffer": None if e_buffer is None else float(e_buffer.mean()),
        "sample_quality": sample_quality(samples, train, test, labels),
    }
    if labels is not None:
        from ebm_losses.frechet import feature_frechet

        metrics["sample_quality"].update(classifier_quality(samples, train, labels, test, seed=seed))
        try:
            metrics["sample_quality"].update(feature_frechet(samples, train, labels, test, seed=seed))
        except InputError as error:  # too few images for a floor: say so, the rest of the report stands
            metrics["sample_quality"]["feature_frechet_skipped"] = str(error)
    if ais_chains:
        own_base = energy.ais_base() if callable(getattr(energy, "ais_base", None)) else None
        exact = energy.exact_base() if callable(getattr(energy, "exact_base", None)) else None
        metrics["ais"] = ais_log_likelihood(
            energy,
            train,
            test,
            n_chains=ais_chains,
            n_temperatures=ais_temperatures,
            seed=seed,
            bounds=None if own_base is not None else (-1.0, 1.0),
            base=own_base,
            exact_base=exact,
        )
    return metrics
