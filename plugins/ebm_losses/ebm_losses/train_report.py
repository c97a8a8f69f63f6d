"""The report of ``ebm train``: the held-out log-likelihood (a grid in 2-d, AIS and its cross-checks otherwise),
the baselines it is measured against, and the run's summary lines."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

import ebmcore
from ebm_losses.jem_report import summary_lines as jem_lines

__all__ = ["GRID_TOLERANCE", "grid_nll", "held_out_report", "summary"]


GRID_TOLERANCE = 0.05
"""The grid's held-out log-likelihood is reliable when its error estimate is at most this many nats."""


def grid_nll(energy: ebmcore.EnergyModel, test: torch.Tensor, lim: float, n: int = 200) -> float:
    """Held-out negative log-likelihood of 2-d ``test`` under ``exp(−E)`` normalised on a grid over ``[−lim, lim]²``."""
    g = torch.linspace(-lim, lim, n, device=test.device)
    xx, yy = torch.meshgrid(g, g, indexing="ij")
    points = torch.stack([xx.flatten(), yy.flatten()], 1)
    with torch.no_grad():
        log_z = torch.logsumexp(-energy.compute_energy(points), 0) + 2 * math.log(float(g[1] - g[0]))
        return float((energy.compute_energy(test) + log_z).mean())


def held_out_report(
    energy: ebmcore.EnergyModel,
    train: torch.Tensor,
    test: torch.Tensor,
    lim: float,
    is_images: bool,
    metrics: dict[str, Any],
    grid: dict[str, Any] | None = None,
    seed: int = 0,
    smc_particles: int = 0,
) -> dict[str, Any]:
    """What the held-out log-likelihood means: ``grid`` (2-d: the grid estimate with its error: how far the NLL moves
    with 100² instead of 200² cells, plus how far with the box widened 1.5× at the same cell size; ``reliable`` when
    that is at most :data:`GRID_TOLERANCE`), ``baselines`` (:func:`ebm_losses.likelihood.baselines` on the box: images ``[−1, 1]^d``,
    else ``[−L, L]^d``, ``L = 1.25·max|x_train|``, the grid's) and ``warnings``: every pair of estimates of one
    quantity that disagree (AIS at two temperature counts, grid against AIS); a disagreement makes both unreliable.

    With ``grid`` (``levels``, ``step``: ``[data] dequantize``, ``train`` and ``test`` dequantised) and AIS, the
    baselines are :func:`ebm_losses.likelihood.chosen_baselines` and ``dequantised`` (:func:`dequantised_report`)
    adds bits per dimension, the model's margins and the second estimate of ``log Z`` (and, with ``smc_particles``, a
    third by adaptive tempered SMC)."""
    from ebm_losses import likelihood

    report: dict[str, Any] = {}
    ais = metrics.get("ais")
    records = list(ais.pop("warnings", [])) if ais else []
    if metrics["held_out_nll"] is not None:
        fine, coarse, wide = metrics["held_out_nll"], grid_nll(energy, test, lim, n=100), grid_nll(energy, test, 1.5 * lim, n=300)
        error = abs(fine - coarse) + abs(fine - wide)
        report["grid"] = {
            "test_log_likelihood": -fine,
            "error": error,
            "n": 200,
            "box": [-lim, lim],
            "reliable": error <= GRID_TOLERANCE,
        }
        if ais:
            record = likelihood.compare(
                "held-out log-likelihood",
                ("the grid", -fine, report["grid"]["error"]),
                ("AIS", ais["test_log_likelihood"], ais["standard_error"]),
                note=f"The grid normalises exp(−E) over [−{lim:.3g}, {lim:.3g}]² (its error counts the mass in a 1.5× "
                "wider box), AIS over the plane: it misses the mass its chains do not reach.",
            )
            if record is not None:
                report["grid"]["reliable"] = ais["reliable"] = False
                records.append(record)
    box = (-1.0, 1.0) if is_images else (-(lim or 1.25 * float(train.abs().max())), lim or 1.25 * float(train.abs().max()))
    if grid and ais:
        report["baselines"], report["dequantised"] = dequantised_report(
            energy, train, test, grid, ais, records, seed, smc_particles=smc_particles
        )
    else:
        report["baselines"] = likelihood.baselines(train, test, box)
        step = likelihood.quantum(test) if is_images else None
        if step is not None and step > 1e-3:
            records.append(
                {
                    "quantity": "held-out log-likelihood on the raw grid",
                    "message": f"the held-out images are on a grid of step {step:.3g}: a density's value there depends "
                    "on its smallest variances (the Gaussians' ridge), so the numbers say little; set [data] "
                    "dequantize = true to score dequantised images (nats and bits per dimension).",
                }
            )
    report["warnings"] = records
    return report


IS_SAMPLES = 8192
"""Draws of the importance-sampling estimate of ``log Z`` that checks AIS."""

MIN_CROSS_CHECK_ESS = 100
"""The effective sample size below which importance sampling's ``log Z`` and its delta-method error are too unsure to
confirm AIS's (a proposal far from the model: one draw carries the weight, and a wrong value can still "agree")."""


def dequantised_report(
    energy: ebmcore.EnergyModel,
    train: torch.Tensor,
    test: torch.Tensor,
    grid: dict[str, Any],
    ais: dict[str, Any],
    records: list[dict[str, Any]],
    seed: int,
    *,
    smc_particles: int = 0,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(baselines, dequantised)`` for dequantised ``train`` and ``test: (m, *event_shape)`` on ``grid``'s bins
    (``levels`` ``K``, ``step`` ``δ``) and the model's ``ais`` (:func:`~ebm_losses.image_report.ais_log_likelihood`):
    the baselines with their ridges chosen on validation, and the model's held-out nats per example, bits per
    dimension, margin over each baseline (paired, with ``log Z``'s error), and ``log Z`` by AIS and by importance
    sampling (:func:`~ebm_losses.likelihood.importance_log_z`, :data:`IS_SAMPLES` draws from the model's Gaussian
    base, else from the full Gaussian fitted to ``train`` with its chosen ridge; on AIS's box when AIS ran on one).
    When the two ``log Z`` disagree (:func:`~ebm_losses.likelihood.compare`), or the second cannot be computed or has an
    effective sample size below :data:`MIN_CROSS_CHECK_ESS`,
    ``ais["reliable"]`` becomes False and a record joins ``records``. With ``smc_particles > 0`` adaptive tempered SMC
    (:func:`ebm_samplers.smc.adaptive_tempered_smc`, MALA moves) from the same base as importance sampling gives a
    third ``log Z`` with its standard error, held to AIS's the same way."""
    from ebm_losses import likelihood

    step, d = grid["step"], test[0].numel()
    baselines, per_point = likelihood.chosen_baselines(train, test, (-1.0, 1.0), step=step, seed=seed)
    own = callable(getattr(energy, "ais_base", None))
    exact = energy.exact_base() if callable(getattr(energy, "exact_base", None)) else None
    if own:
        loc, tril = energy.ais_base()
        proposal = "the model's Gaussian base" if exact is None else "the model's own base (a fitted mixture)"
    else:
        x = train.flatten(1).double()
        cov = torch.cov(x.T, correction=0) + baselines["gaussian"]["ridge"] * torch.eye(d, dtype=x.dtype, device=x.device)
        loc, tril = x.mean(0), torch.linalg.cholesky(cov)
        proposal = "the full Gaussian fitted to the dequantised training split"
    on_box = str(ais.get("domain", "")).startswith("the box")
    second = likelihood.importance_log_z(
        energy,
        loc,
        tril,
        event_shape=tuple(test.shape[1:]),
        n=IS_SAMPLES,
        seed=seed,
        bounds=(-1.0, 1.0) if on_box else None,
        base=exact if own else None,
    )
    second["proposal"] = proposal + (" (weight 0 outside the box [-1, 1]^d)" if on_box else "")
    first = ais["log_z"]
    if second["log_z"] is None:
        record = {
            "quantity": "log Z",
            "message": f"log Z: importance sampling from {proposal} had no draw of finite weight, so AIS's "
            f"{first['log_z']:.3f} is not cross-checked; neither is reliable.",
        }
    elif second["effective_sample_size"] < MIN_CROSS_CHECK_ESS:
        record = {
            "quantity": "log Z",
            "message": f"log Z: importance sampling from {proposal} gives {second['log_z']:.3f} with an effective sample "
            f"size of {second['effective_sample_size']:.1f} of {IS_SAMPLES} draws (at least {MIN_CROSS_CHECK_ESS} needed): too "
            f"few to cross-check AIS's {first['log_z']:.3f}, so neither is reliable.",
        }
    else:
        record = likelihood.compare(
            "log Z",
            ("AIS", first["log_z"], first["standard_error"]),
            ("importance sampling", second["log_z"], second["standard_error"]),
            note=f"Importance sampling drew {IS_SAMPLES} points from {proposal} (effective sample size "
            f"{second['effective_sample_size']:.1f}); the held-out log-likelihood moves by as much as log Z.",
        )
    second["passed"] = record is None
    ais.setdefault("checks", {})["importance_sampling"] = second
    if record is not None:
        ais["reliable"] = False
        records.append(record)
    log_z = {"ais": [first["log_z"], first["standard_error"]], "importance_sampling": [second["log_z"], second["standard_error"]]}
    if smc_particles:
        third = smc_log_z(energy, loc, tril, exact if own else None, tuple(test.shape[1:]), smc_particles, seed)
        third["proposal"] = proposal
        log_z["smc"] = [third["log_z"], third["standard_error"]]
        record = likelihood.compare(
            "log Z",
            ("AIS", first["log_z"], first["standard_error"]),
            ("SMC", third["log_z"], third["standard_error"]),
            note=f"SMC moved {smc_particles} particles from {proposal} through {third['stages']} temperatures.",
        )
        third["passed"] = record is None
        ais["checks"]["smc"] = third
        if record is not None:
            ais["reliable"] = False
            records.append(record)
    with torch.no_grad():
        e = torch.cat([energy.compute_energy(chunk) for chunk in test.split(1024)]).double()
    model = -e - first["log_z"]
    value = ais["test_log_likelihood"]
    return baselines, {
        "levels": grid["levels"],
        "step": step,
        "test_log_likelihood": value,
        "test_mean_se": ais["test_mean_se"],
        "bits_per_dim": likelihood.bits_per_dim(value, d, step),
        "log_z": log_z,
        "importance_sampling": second,
        **({"smc": ais["checks"]["smc"]} if smc_particles else {}),
        "margins": likelihood.margins(model, first["standard_error"], per_point),
        "reliable": bool(ais["reliable"]),
    }


def smc_log_z(
    energy: ebmcore.EnergyModel,
    loc: torch.Tensor,
    tril: torch.Tensor,
    exact: Any,
    event_shape: tuple[int, ...],
    n: int,
    seed: int,
) -> dict[str, Any]:
    """``log Z`` of ``exp(−E)`` by adaptive tempered SMC with ``n`` particles from ``N(loc, LLᵀ)`` (or ``exact``, an
    energy's own base in the whitened coordinates): ``log_z``, ``standard_error``, ``stages``, ``min_effective_sample_size`` (over its stages)."""
    from ebm_samplers.smc import adaptive_tempered_smc
    from ebm_samplers.tempered_path import WhitenedBase

    ref = next((p for p in energy.parameters()), loc)
    base = WhitenedBase(loc.to(ref.dtype), tril.to(ref.dtype), event_shape, exact)
    result = adaptive_tempered_smc(energy, n, base=base, generator=torch.Generator(device=loc.device).manual_seed(seed))
    return {
        "log_z": result.log_evidence,
        "standard_error": result.log_evidence_se,
        "n_particles": n,
        "stages": result.n_stages,
        "min_effective_sample_size": min(result.ess) if result.ess else None,
    }


def _reliability(ais: dict[str, Any]) -> str:
    """``reliable``, or what failed among the AIS checks and cross-checks."""
    if ais.get("reliable"):
        return "reliable"
    checks = ais.get("checks", {})
    why = []
    if "ess" in checks and not checks["ess"]["passed"]:
        why.append(f"effective sample size {checks['ess']['effective_sample_size']:.0f} of {ais['log_z']['n_chains']} chains")
    if "temperatures" in checks and not checks["temperatures"]["passed"]:
        why.append(f"{checks['temperatures']['n_temperatures']} temperatures disagree")
    if "importance_sampling" in checks and not checks["importance_sampling"]["passed"]:
        why.append("importance sampling's log Z disagrees")
    return "not reliable" + (f": {', '.join(why)}" if why else ": it disagrees with the grid")


def _baseline_lines(metrics: dict[str, Any]) -> list[str]:
    """The summary's line on the baselines, and one line per disagreement."""
    base = metrics.get("baselines")
    if not base:
        return []
    uniform = base["uniform"]
    low, high = uniform["box"]
    parts = [
        f"uniform on [{low:.3g}, {high:.3g}]^{uniform['dim']} "
        + (
            f"{uniform['log_likelihood']:.3f}"
            if uniform["log_likelihood"] is not None
            else f"-inf ({uniform['n_outside']} points outside)"
        )
    ]
    deq = metrics.get("dequantised")
    names = (("diagonal Gaussian", "diagonal_gaussian"), ("Gaussian", "gaussian"), ("Gaussian mixture", "gaussian_mixture"))
    for name, key in names:
        entry = base.get(key)
        if entry is None or "log_likelihood" not in entry:
            continue
        part = f"{name} {entry['log_likelihood']:.3f} ± {entry['standard_error']:.3f}"
        if deq:
            k = f"{entry['components']} components, " if "components" in entry else ""
            part += f" ({entry['bits_per_dim']:.3f} bits/dim, {k}ridge {entry['ridge']:.2g})"
        parts.append(part)
    if deq:
        parts[0] += f" ({uniform['bits_per_dim']:.3f} bits/dim)" if "bits_per_dim" in uniform else ""
        lines = [
            f"  held-out, dequantised ({deq['levels']} levels, bins of {deq['step']:.4g}): {deq['test_log_likelihood']:.3f} ± "
            f"{deq['test_mean_se']:.3f} nats per example, {deq['bits_per_dim']:.3f} bits/dim "
            f"({'reliable' if deq['reliable'] else 'not reliable'})",
            f"  baselines (held-out log-likelihood, nats; ridges chosen on {base['gaussian']['validation_split']} "
            f"validation points): {'; '.join(parts)}",
            "  margins of the model (nats, paired): "
            + "; ".join(f"{key} {m['margin']:+.3f} ± {m['standard_error']:.3f}" for key, m in deq["margins"].items()),
            _normaliser_line(deq),
        ]
    else:
        lines = [f"  baselines (held-out log-likelihood, nats): {'; '.join(parts)}"]
    return [*lines, *(f"  warning: {record['message']}" for record in metrics.get("warnings", []))]


def _normaliser_line(deq: dict[str, Any]) -> str:
    """The summary's line on the two estimates of ``log Z``."""
    (a, a_se), (b, b_se) = deq["log_z"]["ais"], deq["log_z"]["importance_sampling"]
    second = deq["importance_sampling"]
    shown = "no finite weight" if b is None else f"{b:.3f} ± {b_se:.3f}"
    third = deq.get("smc")
    verdict = "agree" if second.get("passed") and (third is None or third.get("passed")) else "DISAGREE"
    smc = "" if third is None else f", SMC {third['log_z']:.3f} ± {third['standard_error']:.3f} ({third['stages']} temperatures)"
    return (
        f"  log Z: AIS {a:.3f} ± {a_se:.3f}, importance sampling {shown} (effective sample size "
        f"{second['effective_sample_size']:.0f} of {second['n']}){smc}: {verdict}"
    )


def summary(metrics: dict[str, Any], out: Path) -> str:
    nll = metrics["held_out_nll"]
    return "\n".join(
        [
            f"trained to step {metrics['steps']} in {metrics['wall_time_s']:.1f} s"
            + (f" ({metrics['throughput_samples_per_s']:,.0f} samples/s)" if metrics["throughput_samples_per_s"] else ""),
            f"  final loss {metrics['final_loss']:.4g}"
            + (f", held-out NLL {nll:.3f} nats" if nll is not None else "")
            + (
                f", AIS held-out log-likelihood {ais['test_log_likelihood']:.3f} ± {ais['standard_error']:.3f} nats"
                f" ({_reliability(ais)})"
                if (ais := metrics.get("ais"))
                else ""
            ),
            *_sample_quality_lines(metrics.get("sample_quality")),
            *jem_lines(metrics.get("jem")),
            *_baseline_lines(metrics),
            *_watchdog_lines(metrics.get("watchdog")),
            f"  model: {out / 'model.pt'} (sample it with [energy] model = \"{out / 'model.pt'}\")",
            f"  metrics: {out / 'metrics.json'}"
            + (f" (no plots: {skipped})" if (skipped := metrics.get("plots_skipped")) else f"; plots in {out}"),
        ]
    )


def _sample_quality_lines(quality: dict[str, Any] | None) -> list[str]:
    """The summary's lines on image samples: for labelled images the classifier ratio, the confident classes and the
    spread, and the feature Fréchet distance beside real data's (its floor); for all images the pixel histogram
    against the data's, and a warning for each pixel band outside its tolerance."""
    if not quality:
        return []
    times = lambda r: "n/a" if r is None else f"{r:.2f}×"  # noqa: E731
    lines = []
    if "classifier_ratio" in quality:
        ratio = quality["classifier_ratio"]
        lines.append(
            f"  samples: classifier ratio {'n/a' if ratio is None else f'{ratio:.2f}'} "
            f"({quality['confident_fraction_samples']:.0%} confident at ≥ {quality['confidence']:g}, held-out data "
            f"{quality['confident_fraction_test']:.0%}), {quality['confident_classes']} confident classes, "
            f"spread {quality['spread']:.2f}"
        )
    if "feature_frechet_skipped" in quality:
        lines.append(f"  samples: no feature Fréchet distance: {quality['feature_frechet_skipped']}")
    if "feature_frechet_distance" in quality:
        low, high = quality["feature_frechet_floor_range"]
        lines.append(
            f"  samples: feature Fréchet distance {quality['feature_frechet_distance']:.2f}, "
            f"{times(quality['feature_frechet_ratio'])} real data's {quality['feature_frechet_floor']:.2f} "
            f"({low:.2f}–{high:.2f} over its reserves; {quality['feature_frechet_n']} images a side; the features "
            "of a classifier trained on the training split, not Inception FID)"
        )
    if "pixel_wasserstein" in quality:
        judged = "within" if quality["pixel_fractions_ok"] else "NOT within"
        w1 = quality["pixel_wasserstein"]
        lines.append(
            f"  pixels: histogram distance (W1) {'n/a' if w1 is None else f'{w1:.3f}'}, real data "
            f"{quality['pixel_wasserstein_floor']:.3f}; saturated {quality['saturated_fraction_samples']:.1%} "
            f"(data {quality['saturated_fraction_data']:.1%}, {times(quality['saturated_ratio'])}), mid grey "
            f"{quality['mid_grey_fraction_samples']:.1%} (data {quality['mid_grey_fraction_data']:.1%}, "
            f"{times(quality['mid_grey_ratio'])}): {judged} {quality['pixel_tolerance']:g}× of the data's"
        )
        lines += [f"  warning: {line}" for line in quality["pixel_warnings"]]
    return lines


def _watchdog_lines(report: dict[str, Any] | None) -> list[str]:
    """The summary's line on the watchdog's rollbacks (none when it rolled nothing back)."""
    if not report or not report["rollbacks"]:
        return []
    k = report["rollbacks"]
    events = "; ".join(
        f"step {e['step']}: {e['reason']}, back to step {e['rolled_back_to']}, lr {e['lr']:.4g}" for e in report["events"]
    )
    return [f"  watchdog: {k} rollback{'s' if k > 1 else ''} ({events})"]
