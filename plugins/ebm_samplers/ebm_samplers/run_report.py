"""What ``ebm sample`` reports: metrics from the kept draws (``ebmcore.diagnostics``), plots, and the summary it prints."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

import ebmcore
from ebmcore import plotting
from ebmcore.recording import finite_summary, nonfinite_chains

log = logging.getLogger(__name__)

__all__ = ["metrics", "diverged", "backends", "plots", "summary", "nonfinite_line"]


def metrics(samples: torch.Tensor, trajectory: torch.Tensor, s: dict[str, Any], wall: float, acceptance: float | None,
            divergences: int | None, summary: dict[str, torch.Tensor] | None = None) -> dict[str, Any]:
    """Sizes, mean, the smallest bulk/tail ESS and largest R-hat over coordinates (``ebmcore.recording.finite_summary``
    of ``trajectory: (n_kept, n_chains, *event)``, or the given ``summary``), throughput and acceptance.

    Chains that went non-finite are counted and named (``nonfinite_chains``, ``nonfinite_chain_indices``) and left out
    of the mean and the diagnostics."""
    bad = diverged(samples, trajectory)
    if summary is None:
        summary = finite_summary(trajectory)
    keep = torch.ones(samples.shape[0], dtype=torch.bool)
    keep[bad] = False
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
    }
    if acceptance is not None:
        out["acceptance"], out["divergences"] = acceptance, divergences
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


def plots(out: Path, energy: ebmcore.EnergyModel, trajectory: torch.Tensor, samples: torch.Tensor, quiet: bool) -> None:
    """``landscape.png`` (2-d), ``trace.png`` and ``autocorrelation.png`` in ``out``, of the chains that stayed finite;
    one line instead without matplotlib or without a finite chain."""
    why_not = plotting.unavailable()
    bad = diverged(samples, trajectory)
    if why_not is None and len(bad) == samples.shape[0]:
        why_not = "every chain went non-finite"
    if why_not is not None:
        if not quiet:
            log.info("plots skipped: %s", why_not)
        return
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


def summary(metrics: dict[str, Any], out: Path) -> str:
    """The lines ``ebm sample`` prints at the end."""
    where = metrics["device"] + (f" x {metrics['world_size']} processes" if metrics.get("world_size", 1) > 1 else "")
    lines = [f"{metrics['sampler']} on {metrics['energy']} ({where}): {metrics['wall_time_s']:.1f} s"]
    if metrics.get("step_size") is not None:
        lines.append(f"  step size {metrics['step_size']:.4g}: {metrics['step_size_source']}")
    if "n_chunks" in metrics:
        lines.append(f"  {metrics['n_samples']} samples in {metrics['n_chunks']} chunks "
                     f"({metrics['chunks_resumed']} resumed) -> {out / 'chunks'}")
        if metrics.get("acceptance") is not None:
            lines.append(f"  acceptance {metrics['acceptance']:.3f}")
        if metrics.get("nonfinite_chains"):
            lines.append(f"  {nonfinite_line(metrics)}")
        lines.append(f"  metrics: {out / 'metrics.json'}")
        return "\n".join(lines)
    ess = "" if metrics["ess_bulk_min"] is None else (
        f"; ESS bulk min {metrics['ess_bulk_min']:.0f}, tail min {metrics['ess_tail_min']:.0f}, R-hat max {metrics['r_hat_max']:.3f}")
    lines.append(f"  {metrics['n_chains']} chains x {metrics['n_kept']} kept draws{ess}")
    if metrics.get("acceptance") is not None:
        lines.append(f"  acceptance {metrics['acceptance']:.3f}, divergences {metrics.get('divergences', 0)}")
    if metrics.get("nonfinite_chains"):
        lines.append(f"  {nonfinite_line(metrics)}; the mean, ESS and R-hat are over the others")
    if metrics.get("draws_file"):
        lines.append(f"  draws and sampler statistics: {out / metrics['draws_file']}")
    lines.append(f"  metrics: {out / 'metrics.json'}; plots and samples in {out}")
    return "\n".join(lines)


def nonfinite_line(metrics: dict[str, Any]) -> str:
    """``k of n chains went non-finite (chains [...])`` from a run's metrics."""
    shown = metrics["nonfinite_chain_indices"]
    total = metrics.get("n_samples", metrics.get("n_chains"))
    more = f" and {len(shown) - 10} more" if len(shown) > 10 else ""
    return f"{metrics['nonfinite_chains']} of {total} chains went non-finite (chains {shown[:10]}{more})"
