"""What ``ebm sample`` reports: metrics from the kept draws (``ebmcore.diagnostics``), the warnings they call for
(:func:`warnings`), plots, and the summary it prints."""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import torch

import ebmcore
from ebmcore import plotting
from ebmcore.recording import finite_summary, nonfinite_chains

log = logging.getLogger(__name__)

__all__ = [
    "metrics",
    "warnings",
    "mode_groups",
    "diverged",
    "backends",
    "plots",
    "summary",
    "nonfinite_line",
    "RHAT_LIMIT",
    "ESS_PER_CHAIN",
    "EBFMI_LIMIT",
    "MODE_GAP",
    "MODE_MIN_CHAINS",
    "TINY_STEP",
]

RHAT_LIMIT = 1.01
"""Warn above this R-hat (rank-normalised split R-hat; Vehtari et al. 2021, as Stan, PyMC and ArviZ)."""
ESS_PER_CHAIN = 100
"""Warn when the bulk or tail ESS is below this many per chain (Vehtari et al. 2021: bulk-ESS > 100 × chains, Stan's
rule): fewer, and each chain's autocorrelation, so R-hat and the ESS itself, are not estimated reliably."""
EBFMI_LIMIT = 0.3
"""Warn when a chain's E-BFMI (HMC, NUTS) is below this (Stan's threshold)."""
MODE_GAP = 4.0
"""The chains' means are in separate groups (evidence of several modes, :func:`mode_groups`) when, along some
coordinate, the gap between two groups is above this many standard deviations of the chain means within a group."""
MODE_MIN_CHAINS = 16
"""Fewer chains than this give no evidence of modes: a few chain means scattered at random show gaps as large."""
TINY_STEP = 0.1
"""A step size is tiny when the distance a step moves (``√(2h)`` for Langevin and MALA, ``h`` for HMC) is below this
fraction of the draws' largest standard deviation: crossing the target then takes hundreds of steps at least."""


def metrics(
    samples: torch.Tensor,
    trajectory: torch.Tensor,
    s: dict[str, Any],
    wall: float,
    acceptance: float | None,
    divergences: int | None,
    summary: dict[str, torch.Tensor] | None = None,
    stats: dict[str, torch.Tensor] | None = None,
) -> dict[str, Any]:
    """Sizes, mean, the smallest bulk/tail ESS and largest R-hat over coordinates (``ebmcore.recording.finite_summary``
    of ``trajectory: (n_kept, n_chains, *event)``, or the given ``summary``), throughput and acceptance; with the
    per-draw ``stats`` of a Hamiltonian sampler (``hamiltonian: (n_kept, n_chains)``), the smallest E-BFMI
    (``ebfmi_min``) and how many chains are below :data:`EBFMI_LIMIT` (``ebfmi_low_chains``).

    Chains that went non-finite are counted and named (``nonfinite_chains``, ``nonfinite_chain_indices``) and left out
    of the mean and the diagnostics."""
    bad = diverged(samples, trajectory)
    if summary is None:
        summary = finite_summary(trajectory)
    keep = torch.ones(samples.shape[0], dtype=torch.bool)
    keep[bad] = False
    kept = trajectory[:, keep.to(trajectory.device)] if bad else trajectory
    kept = kept.reshape(kept.shape[0], kept.shape[1], -1)  # (n_kept, finite chains, k)
    out: dict[str, Any] = {
        "n_chains": trajectory.shape[1],
        "n_kept": trajectory.shape[0],
        "mean": samples[keep.to(samples.device)].double().mean(0).flatten().tolist() if keep.any() else None,
        "ess_bulk_min": float(summary["ess_bulk"].min()) if summary else None,
        "ess_tail_min": float(summary["ess_tail"].min()) if summary else None,
        "r_hat_max": float(summary["r_hat"].max()) if summary else None,
        "throughput_chain_steps_per_s": trajectory.shape[1] * (s["n_steps"] + s["burn_in"]) / max(wall, 1e-9),
        "sampling_time_s": wall,
        "nonfinite_chains": len(bad),
        "nonfinite_chain_indices": bad,
        "draws_std_max": (
            float(kept.std(0).max())
            if kept.shape[0] >= 2 and kept.shape[1] and kept.shape[2] and kept.is_floating_point()
            else None
        ),
        "mode_groups": mode_groups(kept.mean(0)) if kept.shape[0] and kept.shape[1] and kept.is_floating_point() else None,
    }
    if s.get("name"):
        out["sampler"] = s["name"]
    if acceptance is not None:
        out["acceptance"], out["divergences"] = acceptance, divergences
    hamiltonian = (stats or {}).get("hamiltonian")
    if hamiltonian is not None and hamiltonian.dim() == 2 and hamiltonian.shape[0] >= 3:
        bfmi = ebmcore.diagnostics.ebfmi(hamiltonian[:, keep.to(hamiltonian.device)].cpu())
        bfmi = bfmi[torch.isfinite(bfmi)]  # a chain whose energy never changed has none
        if bfmi.numel():
            out["ebfmi_min"], out["ebfmi_low_chains"] = float(bfmi.min()), int((bfmi < EBFMI_LIMIT).sum())
    return out


def mode_groups(means: torch.Tensor) -> dict[str, Any] | None:
    """Evidence that the chains sit in different modes, from their means ``(n_chains, k)``: the coordinate along which
    the sorted chain means have the widest gap between two groups of at least 5 % of the chains (and 2), measured in
    standard deviations of the means within the groups (``gap``, with the groups' ``sizes``), when that gap is above
    :data:`MODE_GAP`; None without such a gap, or with fewer than :data:`MODE_MIN_CHAINS` chains. Chains that mix
    slowly through one mode spread their means evenly, without such a gap."""
    m = means.shape[0]
    if m < MODE_MIN_CHAINS or not means.numel():
        return None
    x = means.double().sort(0).values
    x = x[:, torch.isfinite(x).all(0)]
    if not x.shape[1]:
        return None
    lo = max(2, math.ceil(0.05 * m))
    zero = torch.zeros_like(x[:1])
    s1, s2 = torch.cat([zero, x.cumsum(0)]), torch.cat([zero, (x * x).cumsum(0)])
    i = torch.arange(lo, m - lo + 1, device=x.device)  # the first i sorted chains form the lower group
    n_low = i.to(x.dtype).unsqueeze(1)
    mean_low, mean_high = s1[i] / n_low, (s1[-1] - s1[i]) / (m - n_low)
    var_low = (s2[i] / n_low - mean_low**2).clamp_min(0)
    var_high = ((s2[-1] - s2[i]) / (m - n_low) - mean_high**2).clamp_min(0)
    spread = torch.maximum(var_low, var_high).sqrt()
    score = (x[i] - x[i - 1]) / spread.clamp_min(1e-12 * float(x.abs().max().clamp_min(1e-300)))
    best = int(score.argmax())
    split, coordinate = divmod(best, score.shape[1])
    gap = float(score.flatten()[best])
    if not gap > MODE_GAP:
        return None
    return {"coordinate": coordinate, "gap": min(gap, 1e6), "sizes": [int(i[split]), m - int(i[split])]}


_NEXT_SAMPLER = {
    "langevin": "MALA or NUTS rather than unadjusted Langevin",
    "mala": "NUTS rather than MALA: its warm-up adapts a mass matrix to the target's scales",
    "hmc": "NUTS rather than HMC's fixed trajectory length: its warm-up adapts a mass matrix too",
}


def _tiny_step(metrics: dict[str, Any]) -> str | None:
    """``step size h, moving about d per step against the draws' spread s``, when that is tiny (:data:`TINY_STEP`)."""
    h, spread, sampler = metrics.get("step_size"), metrics.get("draws_std_max"), metrics.get("sampler")
    if h is None or not spread or sampler not in ("langevin", "mala", "hmc") or not h > 0:
        return None
    moves = h if sampler == "hmc" else math.sqrt(2 * h)
    if moves >= TINY_STEP * spread:
        return None
    return f"the step size {h:.2g} moves about {moves:.2g} per step against the draws' spread {spread:.2g}"


def warnings(metrics: dict[str, Any]) -> list[str]:
    """One line per diagnostic of a run's ``metrics`` that says its draws are not to be trusted as they are, each
    naming the fix: R-hat above :data:`RHAT_LIMIT`, bulk or tail ESS below :data:`ESS_PER_CHAIN` per chain, any
    divergent transition, E-BFMI below :data:`EBFMI_LIMIT` (Stan's, PyMC's and ArviZ's checks). Empty for a
    streamed run (its chunks keep no trajectory).

    The fix follows the sampler that ran (``metrics["sampler"]``), which it never names as the remedy: a high R-hat
    with a tiny step size (``step_size`` against ``draws_std_max``, :data:`TINY_STEP`) calls for NUTS, whose warm-up
    adapts a mass matrix, and a longer warm-up; ``parallel_tempering`` is named only with evidence of several modes
    (``mode_groups``: the chains' means in separate groups)."""
    out = []
    n_chains = metrics.get("n_chains") or 0
    sampler = metrics.get("sampler")
    r_hat = metrics.get("r_hat_max")
    if r_hat is not None and math.isfinite(r_hat) and r_hat > RHAT_LIMIT:
        groups, tiny = metrics.get("mode_groups"), _tiny_step(metrics)
        line = f"R-hat max {r_hat:.3f} > {RHAT_LIMIT}: the chains disagree, they have not mixed"
        if groups:
            low, high = groups["sizes"]
            line += (
                f"; their means fall in separate groups ({low} and {high} chains, {groups['gap']:.3g} standard "
                f"deviations apart along coordinate {groups['coordinate']}): they keep the modes they started in; "
            )
            line += (
                "raise the top temperature or add temperatures, and run longer (burn_in, n_steps)."
                if sampler == "parallel_tempering"
                else "use parallel_tempering to cross between modes, or run much longer (burn_in, n_steps)."
            )
        elif tiny:
            line += (
                f"; {tiny}: it crawls along the target's wide directions. Use NUTS with its mass-matrix "
                "adaptation and a longer warm-up (name = \"nuts\", warmup = 1000, target_accept = 0.8), or run "
                "much longer (burn_in, n_steps)."
            )
        elif sampler == "nuts":
            line += (
                "; run longer (burn_in, n_steps) after a longer warm-up (warmup), which adapts the step size and "
                "the mass matrix to the target's scales."
            )
        elif sampler == "langevin":  # nothing to warm up
            line += f"; run longer (burn_in, n_steps), or use {_NEXT_SAMPLER[sampler]} (both warm up)."
        else:
            line += (
                "; run longer (burn_in, n_steps) after a longer warm-up (warmup"
                + (")" if sampler in _NEXT_SAMPLER or sampler == "parallel_tempering" else ", where the sampler has one)")
                + (
                    f", or use {_NEXT_SAMPLER[sampler]} (name = \"nuts\", warmup = 1000, target_accept = 0.8)."
                    if sampler in ("mala", "hmc")
                    else f", or use {_NEXT_SAMPLER[sampler]}."
                    if sampler in _NEXT_SAMPLER
                    else "."
                )
            )
        out.append(line)
    bulk, tail = metrics.get("ess_bulk_min"), metrics.get("ess_tail_min")
    needed = ESS_PER_CHAIN * n_chains
    if bulk is not None and tail is not None and n_chains and min(bulk, tail) < needed:
        better = (
            _NEXT_SAMPLER[sampler]
            if sampler == "langevin"
            else f"a longer warm-up (warmup), or {_NEXT_SAMPLER[sampler]}"
            if sampler in _NEXT_SAMPLER
            else "a longer warm-up (warmup), which adapts the step size and the mass matrix, or reparametrise the energy"
            if sampler == "nuts"
            else "a better-tuned sampler (a longer warm-up; NUTS adapts a mass matrix)"
        )
        out.append(
            f"ESS bulk min {bulk:.0f}, tail min {tail:.0f} < {needed} ({ESS_PER_CHAIN} per chain x {n_chains} "
            "chains): too few independent draws per chain for reliable means, quantiles and R-hat; run more "
            f"steps (n_steps), or {better}."
        )
    if metrics.get("divergences"):
        out.append(
            f"{metrics['divergences']} divergent transitions: the sampler cannot follow the energy's curvature "
            "there and its draws may miss that region; lower the step size (warm up with a higher "
            "target_accept, e.g. 0.9) or reparametrise the energy."
        )
    if metrics.get("ebfmi_low_chains"):
        out.append(
            f"E-BFMI min {metrics['ebfmi_min']:.2f} < {EBFMI_LIMIT} in {metrics['ebfmi_low_chains']} of {n_chains} "
            "chains: momentum resampling moves poorly through the energy levels (heavy tails, a funnel); "
            "reparametrise the energy, or adapt a mass matrix with a longer warm-up."
        )
    return out


def diverged(samples: torch.Tensor, trajectory: torch.Tensor) -> list[int]:
    """The chains non-finite anywhere in ``trajectory`` or at the end (``samples``), sorted."""
    both = torch.cat([nonfinite_chains(samples).cpu(), nonfinite_chains(trajectory, dim=1).cpu()])
    return sorted(set(both.tolist()))


def backends(energy: ebmcore.EnergyModel, like: torch.Tensor) -> dict[str, str]:
    """The kernel backend each of the energy's ops resolved to (analytic energies)."""
    if not isinstance(energy, ebmcore.AnalyticEnergy):
        return {}
    ops = (f"{energy.op}_energy", f"{energy.op}_gradient")
    return {op: chosen.backend for op in ops if (chosen := ebmcore.explain(op, like).chosen)}


def plots(out: Path, energy: ebmcore.EnergyModel, trajectory: torch.Tensor, samples: torch.Tensor, quiet: bool) -> str | None:
    """``landscape.png`` (2-d), ``trace.png`` and ``autocorrelation.png`` in ``out``, of the chains that stayed finite;
    one line instead without matplotlib or without a finite chain, and why they were skipped is returned (None:
    written)."""
    why_not = plotting.unavailable()
    bad = diverged(samples, trajectory)
    if why_not is None and len(bad) == samples.shape[0]:
        why_not = "every chain went non-finite"
    if why_not is not None:
        if not quiet:
            log.info("plots skipped: %s", why_not)
        return why_not
    if bad:
        keep = torch.ones(samples.shape[0], dtype=torch.bool)
        keep[bad] = False
        trajectory, samples = trajectory[:, keep.to(trajectory.device)], samples[keep.to(samples.device)]
    if trajectory.dim() == 3 and trajectory.shape[2] == 2:
        energy_fn = lambda g: energy.compute_energy(g.to(trajectory.dtype)).double()  # noqa: E731
        plotting.plot_landscape(out / "landscape.png", energy_fn, samples, "energy landscape and samples")
    plotting.plot_traces(out / "trace.png", trajectory)
    if trajectory.shape[0] >= 4:
        acf = ebmcore.diagnostics.autocorrelation(trajectory, max_lag=min(100, trajectory.shape[0] - 1))
        plotting.plot_autocorrelation(out / "autocorrelation.png", acf)
    return None


def summary(metrics: dict[str, Any], out: Path) -> str:
    """The lines ``ebm sample`` prints at the end."""
    where = metrics["device"] + (f" x {metrics['world_size']} processes" if metrics.get("world_size", 1) > 1 else "")
    lines = [
        f"{metrics['sampler']} on {metrics['energy']} ({where}): {metrics['wall_time_s']:.1f} s "
        "(warm-up, sampling, diagnostics and files; start-up not counted)"
    ]
    if metrics.get("step_size") is not None:
        lines.append(f"  step size {metrics['step_size']:.4g}: {metrics['step_size_source']}")
    if "n_chunks" in metrics:
        lines.append(
            f"  {metrics['n_samples']} samples in {metrics['n_chunks']} chunks "
            f"({metrics['chunks_resumed']} resumed) -> {out / 'chunks'}"
        )
        if metrics.get("acceptance") is not None:
            lines.append(f"  acceptance {metrics['acceptance']:.3f}")
        if metrics.get("nonfinite_chains"):
            lines.append(f"  {nonfinite_line(metrics)}")
        lines.append(f"  metrics: {out / 'metrics.json'}")
        return "\n".join(lines)
    ess = (
        ""
        if metrics["ess_bulk_min"] is None
        else (
            f"; ESS bulk min {metrics['ess_bulk_min']:.0f}, tail min {metrics['ess_tail_min']:.0f}, R-hat max {metrics['r_hat_max']:.3f}"
        )
    )
    lines.append(f"  {metrics['n_chains']} chains x {metrics['n_kept']} kept draws{ess}")
    if metrics.get("acceptance") is not None:
        lines.append(f"  acceptance {metrics['acceptance']:.3f}, divergences {metrics.get('divergences', 0)}")
    if metrics.get("nonfinite_chains"):
        lines.append(f"  {nonfinite_line(metrics)}; the mean, ESS and R-hat are over the others")
    if metrics.get("draws_file"):
        lines.append(f"  draws and sampler statistics: {out / metrics['draws_file']}")
    skipped = metrics.get("plots_skipped")
    lines.append(
        f"  metrics: {out / 'metrics.json'}; "
        + (f"samples in {out} (no plots: {skipped})" if skipped else f"plots and samples in {out}")
    )
    lines += [f"warning: {w}" for w in metrics.get("warnings", [])]
    return "\n".join(lines)


def nonfinite_line(metrics: dict[str, Any]) -> str:
    """``k of n chains went non-finite (chains [...])`` from a run's metrics."""
    shown = metrics["nonfinite_chain_indices"]
    total = metrics.get("n_samples", metrics.get("n_chains"))
    more = f" and {len(shown) - 10} more" if len(shown) > 10 else ""
    return f"{metrics['nonfinite_chains']} of {total} chains went non-finite (chains {shown[:10]}{more})"
