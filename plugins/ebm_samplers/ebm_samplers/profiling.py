"""Where a sampler's time goes: ``profile(sampler, x0)`` and ``ebm profile [CONFIG]``.

The breakdown times each component in isolation on the same states, with the same number of
calls per step as the sampler makes: energy/gradient evaluations, random draws, and the
diagnostics recorder; "update and acceptance" is the rest of a step (tensor algebra, selection,
bookkeeping). The breakdown is of the per-step loop; where a fused chain would run instead
(``ebm-cuda``), ``fused_total`` is its time per step. Timings are medians over repeats after a warm-up.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, Callable

import torch

from ebmcore.threads import job_threads

from ebm_samplers.commands import ARGUMENTS, COMMANDS
from ebm_samplers.sampler import AlgorithmSampler

__all__ = ["profile", "format_profile", "add_command"]


def _median_time(fn: Callable[[], Any], repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def profile(
    sampler: Any,
    x0: torch.Tensor,
    n_steps: int = 100,
    *,
    repeats: int = 5,
    generator: torch.Generator | None = None,
    **tunables: Any,
) -> dict[str, Any]:
    """Seconds per step of ``sampler`` (any ``ebmcore.Sampler``): ``total`` and
    ``diagnostics`` (the extra cost of recording them, on top of ``total``; 0 where the run with them was not
    slower, and then ``diagnostics_measured`` is False: the difference is within the timing noise). For an ``ebm_samplers`` sampler also the per-step loop's
    ``energy_gradient``, ``rng``, ``update_acceptance`` and ``gradient_evaluations`` per step (counted), and
    ``fused_total``, seconds per step of the fused chain it runs instead (None if none); for other samplers
    those are None and ``breakdown`` says why."""
    x = sampler.check_initial_state(x0)
    generator = generator or torch.Generator(device=x.device).manual_seed(0)
    per_run = lambda **kw: (
        _median_time(
            lambda: sampler.sample(x, n_steps, generator=generator, **kw, **tunables),  # noqa: E731
            repeats,
        )
        / n_steps
    )
    if not isinstance(sampler, AlgorithmSampler):
        total = per_run()
        return {
            "total": total,
            **_diagnostics(per_run(return_diagnostics=True) - total),
            "energy_gradient": None,
            "rng": None,
            "update_acceptance": None,
            "gradient_evaluations": None,
            "fused_total": None,
            "breakdown": f"{type(sampler).__name__} is not an ebm_samplers algorithm: timed as a whole, no breakdown",
        }
    fused_setting = sampler.fused
    run = sampler.prepare(x, generator, tunables)
    fused_total = per_run() if fused_setting is not False and run.chain else None
    sampler.fused = False
    try:
        total = per_run()
        result = {
            "total": total,
            **_diagnostics(per_run(return_diagnostics=True) - total),
            "fused_total": fused_total,
            "path": run.path,
        }
        return result | _breakdown(sampler, x, n_steps, repeats, generator, tunables, total)
    finally:
        sampler.fused = fused_setting


def _diagnostics(extra: float) -> dict[str, Any]:
    """``diagnostics`` (seconds per step, never negative) and whether it was measured at all (``extra > 0``)."""
    return {"diagnostics": max(extra, 0.0), "diagnostics_measured": extra > 0}


def _breakdown(
    sampler: AlgorithmSampler,
    x: torch.Tensor,
    n_steps: int,
    repeats: int,
    generator: torch.Generator,
    tunables: dict[str, Any],
    total: float,
) -> dict[str, float]:
    """The per-step loop's energy/gradient time (with its calls counted), random draws, and the rest."""
    fns = sampler.bind(x)
    calls = {"n": 0}
    real = sampler.bind

    def counting(like: torch.Tensor) -> Any:
        bound = real(like)
        wrap = lambda f: lambda y: (calls.__setitem__("n", calls["n"] + 1), f(y))[1]  # noqa: E731
        return type(bound)(bound.energy, wrap(bound.gradient), wrap(bound.energy_and_gradient))

    sampler.bind = counting
    try:
        sampler.sample(x, n_steps, generator=generator, **tunables)
    finally:
        del sampler.bind
    per_step_evals = calls["n"] / n_steps
    has_acceptance = sampler.algorithm.has_acceptance
    evaluate = fns.energy_and_gradient if has_acceptance else fns.gradient
    n_evals = max(round(per_step_evals * n_steps), 1)

    def evaluations() -> None:
        for _ in range(n_evals):
            evaluate(x)

    energy_gradient = _median_time(evaluations, repeats) / n_steps
    noise = torch.empty_like(x)
    uniform = torch.empty(x.shape[0], device=x.device)

    def draws() -> None:
        for _ in range(n_steps):
            noise.normal_(generator=generator)
            if has_acceptance:
                uniform.uniform_(generator=generator)

    rng = _median_time(draws, repeats) / n_steps
    return {
        "energy_gradient": energy_gradient,
        "rng": rng,
        "update_acceptance": max(total - energy_gradient - rng, 0.0),
        "gradient_evaluations": per_step_evals,
    }


def format_profile(name: str, n_chains: int, result: dict[str, Any]) -> str:
    """The lines ``ebm profile`` prints for :func:`profile`'s ``result``."""
    total = result["total"]
    evals = (
        "" if result["gradient_evaluations"] is None else f"; {result['gradient_evaluations']:.1f} gradient evaluations per step"
    )
    lines = [f"{name}, {n_chains} chains: {total * 1e3:.3f} ms per step ({n_chains / total:,.0f} chain-steps/s{evals})"]
    if result.get("breakdown"):
        lines.append(f"  breakdown: {result['breakdown']}")
    if result.get("path"):
        lines.append(f"  path sample() takes: {result['path']}")
    for key, label in (
        ("energy_gradient", "energy and gradient"),
        ("rng", "random numbers"),
        ("update_acceptance", "update and acceptance"),
    ):
        if result[key] is not None:
            lines.append(f"  {label:<28} {result[key] * 1e3:9.3f} ms  {100 * result[key] / total:5.1f} %")
    label = "diagnostics (when recorded)"
    if result.get("diagnostics_measured", True):  # extra time, not a share of the step's
        lines.append(
            f"  {label:<28} {result['diagnostics'] * 1e3:+9.3f} ms  {100 * result['diagnostics'] / total:+5.1f} % "
            "on top of a step"
        )
    else:
        lines.append(f"  {label:<28} not measurable: a run recording them was no slower, within the timing noise")
    if result.get("fused_total") is not None:
        fused = result["fused_total"]
        lines.append(
            f"fused chain (what sample() runs here): {fused * 1e3:.3f} ms per step, "
            f"{total / fused:.1f}x as fast as the per-step loop"
        )
    return "\n".join(lines)


def add_command(subparsers: Any) -> None:
    p = subparsers.add_parser("profile", help=COMMANDS["profile"])
    ARGUMENTS["profile"](p)  # declared without torch, for `ebm profile --help` (ebmcore.commands)
    p.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    from ebm_samplers.sample_job import build, load_config

    config = load_config(
        args.config,
        {"sampler": {"name": args.sampler, "n_chains": args.n_chains}, "run": {"device": args.device, "threads": args.threads}},
    )
    device = torch.device(config["run"]["device"])
    energy, sampler = build(config, device)
    s = config["sampler"]
    g = torch.Generator(device=device).manual_seed(config["run"]["seed"])
    x0 = s["init_scale"] * torch.randn((s["n_chains"], *(energy.event_shape or (2,))), generator=g, device=device)
    with job_threads(config["run"]["threads"]):
        print(format_profile(s["name"], s["n_chains"], profile(sampler, x0, args.n_steps, generator=g)))
    return 0
