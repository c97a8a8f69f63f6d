"""``ebm sample`` with ``[sampler] name = "smc"``: adaptive tempered SMC (:mod:`ebm_samplers.smc`) instead of Markov
chains. The run writes the equal-weight particles as ``samples`` and the weighted ones in ``particles.npz``, and reports
the log evidence ``log Z = log ∫ exp(−E)`` with its standard error, the stages, the ESS and acceptance per stage, and
a judgement of them (:func:`warnings`).

How the configuration reads for SMC: ``n_chains`` is the number of particles, ``init_scale`` the standard deviation
of the Gaussian base ``N(loc, init_scale² I)`` the particles start from, ``target_accept`` the acceptance the moves'
step size is adapted toward, and ``params`` the options of
:func:`~ebm_samplers.smc.adaptive_tempered_smc` (:data:`PARAMS`). The options of a Markov-chain run
(:data:`NOT_APPLICABLE`: burn-in, thinning, warm-up, ``n_steps``, streaming, checkpoints) are refused when given,
by :func:`check_config`, rather than silently ignored. ``ebm_samplers.sample_job`` calls :func:`check_config` and
:func:`run` where it would build a sampler, and :func:`summary` for the lines it prints.
"""

from __future__ import annotations

import io
import logging
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

import ebmcore
from ebmcore import distributed, plotting, runfiles
from ebmcore.config import read_toml
from ebmcore.errors import ConfigError, InputError

from ebm_samplers import run_report
from ebm_samplers.resampling import get_scheme
from ebm_samplers.smc import SMCResult, adaptive_tempered_smc, check_options, default_base

log = logging.getLogger(__name__)

__all__ = [
    "NAME",
    "PARAMS",
    "NOT_APPLICABLE",
    "ESS_FRACTION_LIMIT",
    "SE_LIMIT",
    "ACCEPTANCE_LIMIT",
    "check_config",
    "run",
    "warnings",
    "summary",
]

NAME = "smc"
"""The ``[sampler] name`` that runs this job (not a registered sampler: SMC has no ``init``/``step`` chain)."""

PARAMS = (
    "kernel",
    "kernel_params",
    "n_mcmc_steps",
    "step_size",
    "adapt",
    "target_ess",
    "resampling",
    "min_step",
    "max_stages",
    "loc",
)
"""The ``[sampler] params`` an SMC run takes: :func:`~ebm_samplers.smc.adaptive_tempered_smc`'s options (``loc``: the
base's mean, a number or a list of the event's size)."""

NOT_APPLICABLE: dict[tuple[str, str], tuple[Any, str]] = {
    ("sampler", "n_steps"): (None, "SMC runs as many stages as its tempering needs, not a number of steps"),
    ("sampler", "burn_in"): (0, "SMC's particles start from the base and are tempered to the target; there is no burn-in"),
    ("sampler", "thin"): (1, "SMC keeps one set of particles, not a chain to thin"),
    ("sampler", "warmup"): (0, "SMC adapts the moves' step size within each stage (toward target_accept); there is no warm-up"),
    ("sampler", "metric"): ("diag", "SMC's moves adapt a step size only, not a mass matrix"),
    ("sampler", "rank"): (0, "SMC's moves adapt a step size only, not a mass matrix"),
    ("run", "n_samples"): (0, "SMC cannot stream chunks: every particle takes part in every stage's resampling"),
    ("run", "checkpoint_every"): (0, "an SMC run is one call, without checkpoints"),
    ("output", "per_rank_samples"): (False, "SMC runs in one process"),
    ("output", "live_log"): (False, "the live log has a row per streamed chunk or checkpointed segment, and SMC has neither"),
}
"""``(table, key)``: the value that changes nothing (None: any given value is refused) and why the key does not
apply to SMC."""

ESS_FRACTION_LIMIT = 0.1
"""Warn when a stage's ESS is below this fraction of the particles: the weights have collapsed onto a few particles
(a ``target_ess`` this low, or ``min_step`` forcing steps the ESS could not keep up with)."""
SE_LIMIT = 0.2
"""Warn when the standard error of ``log Z`` is above this many nats: ``Z`` itself is then uncertain by more than
about 20 %."""
ACCEPTANCE_LIMIT = 0.1
"""Warn when a stage's moves accept less than this on average: the particles barely move, resampled duplicates stay
duplicates, and the perfect-mixing standard error is too small."""


def _given(path: Path, bundled: bool, overrides: dict[str, dict[str, Any]] | None) -> dict[str, dict[str, Any]]:
    """The values the user gave: the configuration file's (not the bundled one's: its settings are a Markov-chain run's)
    and the flags'."""
    given = {table: dict(values) for table, values in ({} if bundled else read_toml(path)).items() if isinstance(values, dict)}
    for table, values in (overrides or {}).items():
        given.setdefault(table, {}).update({k: v for k, v in values.items() if v is not None})
    return given


def check_config(
    config: dict[str, Any], path: Path, *, bundled: bool = False, overrides: dict[str, dict[str, Any]] | None = None
) -> None:
    """Refuse, with a :class:`ConfigError` naming the fix, an option that does not apply to SMC (:data:`NOT_APPLICABLE`)
    given in the file at ``path`` or by a flag (``overrides``), a ``params`` key not in :data:`PARAMS`, a value out of
    range (:func:`~ebm_samplers.smc.check_options`), and ``[output] draws = "netcdf"``."""
    given = _given(path, bundled, overrides)
    for (table, key), (neutral, why) in NOT_APPLICABLE.items():
        if key in given.get(table, {}) and (neutral is None or given[table][key] != neutral):
            value = given[table][key]
            flag = key in ((overrides or {}).get(table) or {}) and (overrides or {})[table][key] is not None
            shown = str(value).lower() if isinstance(value, bool) else repr(value)  # as TOML writes a boolean
            where = f"--{key.replace('_', '-')} {value}" if flag else f"{path} [{table}] {key} = {shown}"
            fix = "remove it" + ("" if neutral is None else f" (or set it to {neutral!r})")
            raise ConfigError(f"{where}: does not apply to name = {NAME!r}: {why}; {fix}.")
    draws = config["output"]["draws"]
    if draws == "netcdf":
        raise ConfigError(
            f"{path} [output] draws = 'netcdf': an smc run has no chains for ArviZ; draws = 'npz' writes the weighted "
            "particles to particles.npz, 'none' leaves that file out."
        )
    s = config["sampler"]
    params = s["params"]
    if s["n_chains"] < 2:
        raise ConfigError(
            f"{path} [sampler] n_chains = {s['n_chains']}: an {NAME} run needs at least 2 particles (n_chains); "
            "1000 give standard errors of log Z near 0.05 nats on the examples of docs/samplers.md."
        )
    if "scale" in params:
        raise ConfigError(
            f"{path} [sampler] params: scale: the base's standard deviation is [sampler] init_scale; set that instead."
        )
    if unknown := sorted(set(params) - set(PARAMS)):
        raise ConfigError(f"{path} [sampler] params: {NAME} takes no {', '.join(unknown)}; its params are {', '.join(PARAMS)}.")
    if not isinstance(params.get("adapt", True), bool):
        raise ConfigError(f"{path} [sampler] params: adapt must be true or false, got {params['adapt']!r}.")
    options = {k: v for k, v in params.items() if k not in ("adapt", "loc")}
    try:
        check_options(s["n_chains"], target_accept=s["target_accept"], **options)
    except InputError as exc:
        raise ConfigError(f"{path} [sampler] params ({NAME}, n_chains = {s['n_chains']} particles): {exc}") from None


def run(
    config: dict[str, Any],
    out: Path,
    world: distributed.DistributedRun,
    build_energy: Callable[[dict[str, Any], torch.device], ebmcore.EnergyModel],
    *,
    resume: bool = False,
    quiet: bool = False,
) -> dict[str, Any]:
    """Run adaptive tempered SMC as ``config`` says, into ``out``: ``samples.{pt,npz}`` (the equal-weight particles,
    ``(n, *event_shape)``), ``particles.npz`` (unless ``[output] draws = "none"``: ``particles (n, *event_shape)``,
    normalised ``log_weights (n,)``, and per stage ``betas (K + 1,)``, ``ess (K,)``, ``log_evidence_increments (K,)``,
    ``acceptance (K − 1,)``, ``step_sizes (K − 1,)``), ``landscape.png`` for a 2-d energy, and ``metrics.json``,
    whose metrics are returned. ``build_energy`` is :func:`ebm_samplers.sample_job.build_energy` (passed in, since
    that module imports this one)."""
    if world.active:
        raise ConfigError(
            f"[sampler] name = {NAME!r} runs in one process: every particle takes part in every resampling; "
            "run it without torchrun."
        )
    if resume:
        raise ConfigError(
            f"--resume continues a streamed or checkpointed run, and an {NAME} run is neither: run it again without "
            "--resume (add --overwrite to replace the run in the directory)."
        )
    s, r, device = config["sampler"], config["run"], world.device
    try:
        energy = build_energy(config["energy"], device)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{config['source']} [energy]: {exc}") from None
    runfiles.make_dir(out)
    runfiles.start_run(out, config)
    generator = torch.Generator(device=device).manual_seed(r["seed"])
    params = dict(s["params"])
    loc, shape = params.pop("loc", 0.0), tuple(energy.event_shape or (2,))
    try:
        base = default_base(energy, loc, s["init_scale"], shape, None, device)
    except (RuntimeError, TypeError, ValueError):  # a loc that is not numbers broadcasting to the event shape
        raise ConfigError(
            f"{config['source']} [sampler] params: loc = {loc!r} does not fit the energy's event shape {shape}: give "
            "a number, or a list of that shape."
        ) from None
    start = time.perf_counter()
    result = adaptive_tempered_smc(
        energy, s["n_chains"], base=base, target_accept=s["target_accept"], generator=generator, **params
    )
    sampling = time.perf_counter() - start
    idx = get_scheme(params.get("resampling", "systematic"))(result.log_weights.exp(), s["n_chains"], generator)
    samples = result.particles[idx]
    metrics = _metrics(result, config, sampling)
    metrics["samples_mean"] = samples.double().mean(0).flatten().tolist()
    runfiles.save_samples(out, "samples", samples)
    metrics["draws_file"] = _save_particles(out, result) if config["output"]["draws"] != "none" else None
    metrics["plots_skipped"] = _plot(out, energy, samples, quiet) if config["output"]["plots"] else "[output] plots = false"
    metrics["warnings"] = warnings(metrics)
    metrics.update(
        sampler=NAME,
        energy=config["energy"]["name"] or config["energy"]["model"],
        wall_time_s=time.perf_counter() - start,
        device=str(device),
        kernel_backends=run_report.backends(energy, samples),
    )
    runfiles.write_json(out / "metrics.json", metrics)
    return metrics


def _metrics(result: SMCResult, config: dict[str, Any], sampling: float) -> dict[str, Any]:
    """The run's numbers: ``log Z`` and its SE, the ladder, and the ESS and acceptance per stage with their extremes."""
    n, params = result.particles.shape[0], config["sampler"]["params"]
    ess = result.ess
    return {
        "log_evidence": result.log_evidence,
        "log_evidence_se": result.log_evidence_se,
        "n_particles": n,
        "n_stages": result.n_stages,
        "kernel": result.kernel,
        "n_mcmc_steps": params.get("n_mcmc_steps", 5),
        "resampling": result.resampling,
        "target_ess": params.get("target_ess", 0.5),
        "target_accept": config["sampler"]["target_accept"],
        "base": {"loc": params.get("loc", 0.0), "scale": config["sampler"]["init_scale"]},
        "betas": result.betas,
        "ess": ess,
        "ess_min": min(ess),
        "ess_fraction_min": min(ess) / n,
        "ess_final": ess[-1],
        "ess_fraction_final": ess[-1] / n,
        "log_evidence_increments": result.log_evidence_increments,
        "acceptance": result.acceptance,
        "acceptance_min": min(result.acceptance) if result.acceptance else None,
        "acceptance_mean": sum(result.acceptance) / len(result.acceptance) if result.acceptance else None,
        "step_sizes": result.step_sizes,
        "sampling_time_s": sampling,
    }


def _save_particles(out: Path, result: SMCResult) -> str:
    """``particles.npz``: the weighted particles and the per-stage statistics (:func:`run`); its name."""
    buffer = io.BytesIO()
    arrays = {
        "particles": runfiles.as_numpy(result.particles),
        "log_weights": runfiles.as_numpy(result.log_weights),
        **{k: np.asarray(getattr(result, k), dtype=np.float64) for k in ("betas", "ess", "log_evidence_increments")},
        **{k: np.asarray(getattr(result, k), dtype=np.float64) for k in ("acceptance", "step_sizes")},
    }
    np.savez(buffer, **arrays)
    runfiles.write_bytes(out / "particles.npz", buffer.getbuffer())
    return "particles.npz"


def _plot(out: Path, energy: ebmcore.EnergyModel, samples: torch.Tensor, quiet: bool) -> str | None:
    """``landscape.png`` (the energy's contours under the equal-weight particles) for a 2-d energy; else why not."""
    why_not = plotting.unavailable()
    if why_not is None and (samples.dim() != 2 or samples.shape[1] != 2):
        why_not = f"an {NAME} run plots the 2-d landscape only, and these particles have shape {tuple(samples.shape[1:])}"
    if why_not is not None:
        if not quiet:
            log.info("plots skipped: %s", why_not)
        return why_not
    energy_fn = lambda g: energy.compute_energy(g.to(samples.dtype)).double()  # noqa: E731
    plotting.plot_landscape(out / "landscape.png", energy_fn, samples, f"{NAME}: energy landscape and particles")
    return None


def warnings(metrics: dict[str, Any]) -> list[str]:
    """One line per number of an SMC run's ``metrics`` that says not to trust it as it is, each naming the fix: a
    standard error of ``log Z`` above :data:`SE_LIMIT`, an ESS fraction below :data:`ESS_FRACTION_LIMIT` at some
    stage (the final one named), a stage whose moves accepted less than :data:`ACCEPTANCE_LIMIT`, and no moves."""
    out = []
    n = metrics["n_particles"]
    se = metrics["log_evidence_se"]
    if not se <= SE_LIMIT:
        out.append(
            f"log Z standard error {se:.3g} > {SE_LIMIT} nats: Z is uncertain by more than about {SE_LIMIT:.0%}; use "
            "more particles (n_chains: the SE falls as 1/sqrt(n)), or a base closer to the target (params.loc, "
            "init_scale), which needs fewer stages."
        )
    low = metrics["ess_fraction_min"]
    if low < ESS_FRACTION_LIMIT:
        final = metrics["ess_fraction_final"]
        fix = (
            f"raise params.target_ess (now {metrics['target_ess']}) toward 0.5"
            if metrics["target_ess"] < ESS_FRACTION_LIMIT
            else "use more particles (n_chains), or a base closer to the target (params.loc, init_scale), or a smaller "
            "params.min_step: the temperature was forced on faster than the weights could follow"
        )
        out.append(
            f"ESS fell to {metrics['ess_min']:.0f} of {n} particles ({low:.2f} < {ESS_FRACTION_LIMIT}; final "
            f"{metrics['ess_final']:.0f}, {final:.2f}): the weights rest on a few particles, and the samples repeat "
            f"them; {fix}."
        )
    acc = metrics["acceptance_min"]
    if acc is not None and acc < ACCEPTANCE_LIMIT:
        out.append(
            f"acceptance per stage min {acc:.3f} < {ACCEPTANCE_LIMIT}: the {metrics['kernel']} moves barely move the "
            "particles there, so resampled duplicates stay duplicates and the standard error is too small; raise "
            "params.n_mcmc_steps, keep params.adapt = true, or use kernel = \"hmc\" or \"nuts\"."
        )
    if acc is None and metrics["n_stages"] > 1:
        out.append(
            f"no moves between {metrics['n_stages']} stages (params.n_mcmc_steps = 0): the samples are the base's "
            "draws resampled, with duplicates, and the standard error assumes moves; set n_mcmc_steps >= 1."
        )
    return out


def summary(metrics: dict[str, Any], out: Path) -> str:
    """The lines ``ebm sample`` prints at the end of an SMC run: every number with its judgement."""
    n, se = metrics["n_particles"], metrics["log_evidence_se"]
    lines = [
        f"{NAME} on {metrics['energy']} ({metrics['device']}): {metrics['wall_time_s']:.1f} s "
        "(tempering, moves and files; start-up not counted)",
        f"  log Z = {metrics['log_evidence']:.3f} ± {se:.3f} (perfect-mixing standard error: "
        + (f"within {SE_LIMIT} nats)" if se <= SE_LIMIT else f"above {SE_LIMIT} nats, see below)"),
        f"  {metrics['n_stages']} stages from the base N({_loc(metrics['base']['loc'])}, {metrics['base']['scale']:g}²); "
        f"ESS per stage min {metrics['ess_min']:.0f} of {n} particles ({metrics['ess_fraction_min']:.2f}"
        + (f" >= {ESS_FRACTION_LIMIT}" if metrics["ess_fraction_min"] >= ESS_FRACTION_LIMIT else f" < {ESS_FRACTION_LIMIT}")
        + f"), final {metrics['ess_final']:.0f}",
    ]
    if metrics["acceptance_min"] is not None:
        acc = metrics["acceptance_min"]
        lines.append(
            f"  {metrics['n_mcmc_steps']} {metrics['kernel']} moves per stage; acceptance per stage min {acc:.3f} "
            + (f"(>= {ACCEPTANCE_LIMIT})" if acc >= ACCEPTANCE_LIMIT else f"(< {ACCEPTANCE_LIMIT})")
            + f", mean {metrics['acceptance_mean']:.3f} (target {metrics['target_accept']})"
        )
    lines.append(
        "  judgement: "
        + (
            f"{len(metrics['warnings'])} warning{'s' if len(metrics['warnings']) > 1 else ''} below"
            if metrics["warnings"]
            else "no warning; a mode that no particle reached stays unseen by the SE: other --seed values check that"
        )
    )
    lines.append(f"  {n} equal-weight particles ({metrics['resampling']} resampling) are the samples")
    if metrics.get("draws_file"):
        lines.append(f"  weighted particles and per-stage statistics: {out / metrics['draws_file']}")
    skipped = metrics.get("plots_skipped")
    lines.append(
        f"  metrics: {out / 'metrics.json'}; "
        + (f"samples in {out} (no plots: {skipped})" if skipped else f"plot and samples in {out}")
    )
    lines += [f"warning: {w}" for w in metrics["warnings"]]
    return "\n".join(lines)


def _loc(loc: Any) -> str:
    return f"{loc:g}" if isinstance(loc, (int, float)) else str(loc)
