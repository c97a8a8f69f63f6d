"""``ebm sample``: sample an energy (a registered one or a model from ``ebm train``) with any
registered sampler, with warm-up, burn-in and thinning; write samples, the draws with their sampler
statistics (:mod:`ebm_samplers.draws`), metrics and plots to a run directory. With ``n_samples > 0``
it streams chunks of independent chains to disk instead, with bounded memory, and ``--resume`` skips
the chunks already written. ``[output] live_log`` writes a row per chunk or checkpointed segment to ``log.csv``
(and TensorBoard) as the run goes (:mod:`ebm_samplers.live_log`).

The energy and the sampler are built once. A sampler of the core contract (``init``/``step``)
runs everywhere; what needs more (warm-up needs an acceptance statistic) is skipped with one line.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import logging
import os
import sys
import time
from importlib import resources
from pathlib import Path
from typing import Any, Iterator

import torch

import ebmcore
from ebmcore import chunks, distributed, registry, runfiles
from ebmcore.config import load_job_config, non_negative, parse_device, positive, seed_range, thread_count
from ebmcore.errors import ConfigError, InputError, RunFileError
from ebmcore.recording import available_memory
from ebmcore.threads import job_threads

from ebm_samplers import draws, live_log, run_report, smc_job
from ebm_samplers.commands import ARGUMENTS, COMMANDS
from ebm_samplers.adaptation import METRICS, cannot_warm_up, check_metric, warmup
from ebm_samplers.params import event_size
from ebm_samplers.sampler import AlgorithmSampler

log = logging.getLogger(__name__)

__all__ = ["SCHEMA", "load_config", "build_energy", "build", "run", "add_command"]

SCHEMA: dict[str, Any] = {  # the defaults are the bundled configuration's (a test keeps them equal)
    "energy": {"name": ((str,), ""), "params": ((dict,), {}), "model": ((str,), "")},
    "sampler": {
        "name": ((str,), "mala"),
        "params": ((dict,), {}),
        "n_chains": ((int, positive), 1000),
        "n_steps": ((int, positive), 1000),
        "burn_in": ((int, non_negative), 500),
        "thin": ((int, positive), 1),
        "warmup": ((int, non_negative), 300),
        "target_accept": ((float, lambda v: None if 0 < v < 1 else "must be in (0, 1)"), 0.6),
        "init_scale": ((float, int, positive), 1.0),
        "metric": ((str, lambda v: None if v in METRICS else f"must be one of {', '.join(METRICS)}"), "diag"),
        "rank": ((int, non_negative), 0),
    },
    "run": {
        "seed": ((int, seed_range), 0),
        "device": ((str,), "cpu"),
        "backend": ((str,), ""),
        "n_samples": ((int, non_negative), 0),
        "chunk_size": ((int, positive), 100_000),
        "checkpoint_every": ((int, non_negative), 0),
        "threads": ((int, thread_count), 1),
    },
    "output": {
        "dir": ((str,), "runs/sample"),
        "plots": ((bool,), True),
        "per_rank_samples": ((bool,), False),
        "draws": ((str, lambda v: None if v in draws.FORMATS else f"must be one of {', '.join(draws.FORMATS)}"), "npz"),
        "live_log": ((bool, dict, lambda v: live_log.LiveLog.config_problem(v, ("tensorboard",), prefix="sample")), False),
    },
}


LOG_COLUMNS = (
    "wall_time",
    "n_chains",
    "steps",
    "acceptance",
    "step_size",
    "energy_mean",
    "divergences",
    "nonfinite_chains",
    "sampling_s",
)
"""The live log's columns after the key (``chunk`` or ``segment``, the index of its file), one row per ``sample`` call."""

REPORT_EVERY_S = 30.0
"""Without a terminal (logs), a streamed run logs its progress at most this often (seconds)."""


def default_config_path() -> Path:
    return Path(str(resources.files("ebm_samplers") / "configs" / "sample_default.toml"))


def load_config(path: str | Path | None, overrides: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """Read and check a sample configuration (the bundled default without ``path``); ``overrides``
    (``{"table": {"key": value}}``, from command-line flags) are applied first."""
    path = Path(path) if path else default_config_path()
    config = load_job_config(path, SCHEMA, overrides)
    energy = config["energy"]
    if bool(energy["name"]) == bool(energy["model"]):
        raise ConfigError(
            f"{path} [energy]: give either 'name' (a registered energy) or 'model' (a file from ebm train), not both or neither."
        )
    if energy["model"] and energy["params"]:
        raise ConfigError(f"{path} [energy]: 'params' applies to 'name' only; a model file carries its own.")
    parse_device(config["run"]["device"], f"{path} [run] device")
    s = config["sampler"]
    if (s["metric"] == "low_rank") != (s["rank"] > 0):
        raise ConfigError(
            f"{path} [sampler]: rank = {s['rank']} with metric = {s['metric']!r}; metric = 'low_rank' needs "
            "rank >= 1 (the eigenpairs kept), the other metrics take rank = 0."
        )
    if s["name"] == smc_job.NAME:  # tempered SMC: its own loop and options, not a registered chain sampler
        smc_job.check_config(config, path, bundled=path == default_config_path(), overrides=overrides)
    else:
        registry.get("sampler", config["sampler"]["name"])
    if energy["name"]:
        registry.get("energy", energy["name"])
    elif not Path(energy["model"]).is_file():
        raise ConfigError(f"{path} [energy] model: no such file {energy['model']!r}; train one with `ebm train`.")
    if config["output"]["draws"] == "netcdf":
        from ebm_samplers.arviz_export import unavailable

        if (why_not := unavailable()) is not None:
            if ((overrides or {}).get("output") or {}).get("draws") == "netcdf":  # the flag, not the file, asked for it
                raise ConfigError(f"--format netcdf: {why_not}; or write draws.npz with --format npz.")
            raise ConfigError(f"{path} [output] draws = 'netcdf': {why_not}; or write draws.npz with draws = 'npz'.")
    _check_live_log(config, path)
    return config


def _check_live_log(config: dict[str, Any], path: Path) -> None:
    """``[output] live_log`` needs rows to write: a streamed or a checkpointed run."""
    r = config["run"]
    if config["output"]["live_log"] is not False and not (r["n_samples"] or r["checkpoint_every"]):
        raise ConfigError(
            f"{path} [output] live_log: the log has a row per streamed chunk or checkpointed segment, and a run "
            "in one call has neither; set [run] n_samples (streaming) or checkpoint_every (segments), or live_log = false."
        )


def build_energy(spec: dict[str, Any], device: torch.device) -> ebmcore.EnergyModel:
    """The energy of an ``[energy]`` table, on ``device``."""
    if spec["model"]:
        fix = "train it again with `ebm train` (or point [energy] model at another model.pt)"
        saved = runfiles.load_torch(Path(spec["model"]), map_location=device, what="a model from ebm train", fix=fix)
        if not (isinstance(saved, dict) and {"energy", "params", "state_dict"} <= set(saved)):
            raise RunFileError(
                f"{spec['model']} is not a model from ebm train (it holds no energy, params and state_dict); {fix}."
            )
        energy = registry.get("energy", saved["energy"])(**saved["params"])
        energy.load_state_dict(saved["state_dict"])
        return energy.to(device)
    return registry.get("energy", spec["name"])(**spec["params"]).to(device)


def build(config: dict[str, Any], device: torch.device) -> tuple[ebmcore.EnergyModel, ebmcore.Sampler]:
    """The energy and the sampler of a configuration, built once; a bad parameter is a :class:`ConfigError` naming its table."""
    try:
        energy = build_energy(config["energy"], device)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{config['source']} [energy]: {exc}") from None
    s = config["sampler"]
    try:
        return energy, registry.get("sampler", s["name"])(energy, **s["params"])
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{config['source']} [sampler] params: {exc}") from None


def tune(
    config: dict[str, Any], sampler: ebmcore.Sampler, x0: torch.Tensor, generator: torch.Generator, quiet: bool
) -> tuple[torch.Tensor, dict[str, Any], dict[str, Any]]:
    """Warm up where asked for and possible: ``(states, tunables to sample with, the step size that will run
    and where it came from)``. A given ``step_size`` runs as given unless ``warmup > 0``."""
    s = config["sampler"]
    given = s["params"].get("step_size")
    source = "given" if given is not None else f"the default of {s['name']} for d = {event_size(x0)}"
    why_not = cannot_warm_up(sampler) if s["warmup"] else None
    tunables: dict[str, Any] = {}
    algo = getattr(sampler, "algorithm", None)
    own = getattr(algo, "warmup", None)  # an algorithm's own warm-up (ChEES, MEADS)
    if s["warmup"] and why_not is None and own is not None:
        adapts = algo.warmup_adapts.format(target_accept=s["target_accept"])
        if s["metric"] != "diag":
            raise ConfigError(
                f"{config['source']} [sampler] metric = {s['metric']!r}: {s['name']}'s warm-up adapts {adapts.split('; ')[-1]}, "
                "and takes no metric setting; remove it."
            )
        tuned = own(sampler, x0, s["warmup"], target_accept=s["target_accept"], generator=generator)
        x0, tunables = tuned.x, tuned.tunables
        source = f"adapted by {s['warmup']} {s['name']} warm-up steps ({adapts}) from {given or 'the default'}"
        if not quiet:
            log.info("warm-up: %d steps, acceptance %.3f", s["warmup"], tuned.acceptance)
    elif s["warmup"] and why_not is None:
        metric = {"metric": s["metric"], "rank": s["rank"] or None}
        try:
            check_metric(sampler, **metric, d=event_size(x0))
        except InputError as exc:
            raise ConfigError(f"{config['source']} [sampler] metric = {s['metric']!r}: {exc}") from None
        tuned = warmup(sampler, x0, s["warmup"], target_accept=s["target_accept"], generator=generator, **metric)
        x0, tunables = tuned.x, tuned.tunables
        metric = "" if s["metric"] == "diag" else f", {s['metric'].replace('_', '-')} metric"
        source = (
            f"adapted by {s['warmup']} warm-up steps (target acceptance {s['target_accept']}{metric}) from "
            f"{given or 'the default'}"
        )
        if not quiet:
            log.info("warm-up: %d steps, acceptance %.3f", s["warmup"], tuned.acceptance)
    elif why_not is not None and not quiet:
        log.info("warm-up skipped: %s", why_not)
    algorithm = isinstance(sampler, AlgorithmSampler) and hasattr(sampler.params, "step_size")
    value = sampler.resolve(x0, tunables).step_size if algorithm else given
    value = None if value is None else float(torch.as_tensor(value, dtype=torch.float64).mean())
    return x0, tunables, {"step_size": value, "step_size_source": source if value is not None else "not reported by the sampler"}


def _initial(
    config: dict[str, Any], energy: ebmcore.EnergyModel, size: int, generator: torch.Generator, device: torch.device
) -> torch.Tensor:
    return config["sampler"]["init_scale"] * torch.randn(
        (size, *(energy.event_shape or (2,))), generator=generator, device=device
    )


def check_size(config: dict[str, Any], energy: ebmcore.EnergyModel, device: torch.device) -> None:
    """Refuse, before the warm-up, a run whose kept draws cannot fit in memory: the trajectory ``(n_steps // thin,
    n_chains, *event)``, and its copy in the draws file, against the memory the device has available
    (:func:`ebmcore.recording.available_memory`)."""
    s = config["sampler"]
    if config["run"]["n_samples"]:  # a stream holds one chunk at a time
        return
    event = energy.event_shape or (2,)
    copies = 1 if config["output"]["draws"] == "none" else 2
    values = (s["n_steps"] // s["thin"]) * s["n_chains"] * int(torch.Size(event).numel())
    needed = copies * values * torch.get_default_dtype().itemsize
    available = available_memory(device)
    if available is not None and needed > available:
        raise ConfigError(
            f"{config['source']} [sampler]: n_steps = {s['n_steps']} // thin = {s['thin']} kept draws of n_chains = "
            f"{s['n_chains']} chains of shape {tuple(event)} need about {needed / 1e9:,.1f} GB (the draws"
            f"{', and their copy in the draws file' if copies == 2 else ''}), more than the {available / 1e9:,.1f} GB "
            f"available on {device}; lower n_steps or n_chains, raise thin, or stream independent chains to disk with "
            "[run] n_samples."
        )


def run(
    config: dict[str, Any], out: Path, *, resume: bool = False, overwrite: bool = False, quiet: bool = False
) -> dict[str, Any]:
    """Run a checked configuration into ``out``; returns the metrics (also in ``out/metrics.json``).

    A run of this same configuration that finished in ``out`` is not run again (its metrics are returned, after
    one line) unless ``overwrite``, which starts afresh. Under ``torchrun`` (``WORLD_SIZE > 1``) the chains are
    sharded across the processes and rank 0 writes the gathered samples, metrics and plots."""
    r = config["run"]
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size > 1 and (r["n_samples"] or r["checkpoint_every"]):
        raise ConfigError("streaming (n_samples) and checkpoint_every are single-process features; run them without torchrun.")
    finished = runfiles.reuse_or_clear(
        out,
        config,
        lambda metrics: _outputs(config, metrics),
        resume=resume,
        overwrite=overwrite,
        what="run",
        again="run it again",
    )
    if finished is not None:
        return finished
    again = "pass --resume to continue that run, --overwrite to start it afresh, or choose another --out."
    if r["n_samples"] and not resume and any((out / "chunks").glob("chunk-*.npz")):
        raise ConfigError(f"{out / 'chunks'} holds chunks already: {again}")
    if not r["n_samples"] and r["checkpoint_every"] and not resume and (out / "checkpoint.pt").exists():
        raise ConfigError(f"{out / 'checkpoint.pt'} exists: {again}")
    selection = tuple(b.strip() for b in r["backend"].split(",") if b.strip())
    use_cuda = r["device"].startswith("cuda")
    world = distributed.init("nccl" if use_cuda else "gloo", device=None if use_cuda and world_size > 1 else r["device"])
    try:
        with ebmcore.use_backend(*selection) if selection else contextlib.nullcontext(), job_threads(r["threads"]):
            return _run(config, out, world, resume, quiet or not world.is_main)
    finally:
        distributed.shutdown(world)


def _outputs(config: dict[str, Any], metrics: dict[str, Any]) -> list[str]:
    """The files a finished run left (one deleted since makes the run unfinished again)."""
    if "n_chunks" in metrics:
        return [f"chunks/chunk-{k:05d}.npz" for k in range(metrics["n_chunks"])]
    draws_file = [metrics["draws_file"]] if metrics.get("draws_file") else []
    if config["output"]["per_rank_samples"]:
        return [f"samples-rank{r}.npz" for r in range(metrics.get("world_size", 1))] + draws_file
    return ["samples.npz"] + draws_file


def _run(config: dict[str, Any], out: Path, world: distributed.DistributedRun, resume: bool, quiet: bool) -> dict[str, Any]:
    s, r, device = config["sampler"], config["run"], world.device
    if s["name"] == smc_job.NAME:  # its own outputs and summary (ebm_samplers.smc_job)
        return smc_job.run(config, out, world, build_energy, resume=resume, quiet=quiet)
    energy, sampler = build(config, device)
    check_size(config, energy, device)
    runfiles.make_dir(out)  # every rank: each may write its own shard
    if world.is_main:
        runfiles.start_run(out, config)
    generator = (
        distributed.rank_generator(r["seed"], world.rank, device)
        if world.active
        else torch.Generator(device=device).manual_seed(r["seed"])
    )
    progress = sys.stderr.isatty() and not quiet
    start = time.perf_counter()
    saved = chunks.load_checkpoint(out, device) if resume and not r["n_samples"] else None
    if saved is not None:  # the warm-up is behind the checkpoint
        x0, tunables, step = saved["x"], saved["tunables"], saved["metadata"]
    else:
        part = distributed.shard(s["n_chains"], world.rank, world.world_size)
        x0, tunables, step = tune(
            config, sampler, _initial(config, energy, part.stop - part.start, generator, device), generator, quiet
        )
    live, logged = _live_log(config, out, sampler, saved, resume, step["step_size"])
    try:
        if r["n_samples"]:
            if not quiet:  # what it costs, up front: each chunk runs burn_in + n_steps steps on its own chains
                n_chunks = -(-r["n_samples"] // r["chunk_size"])
                log.info(
                    "streaming %d samples in %d chunks of up to %d chains, %d steps each (burn_in %d + n_steps %d): %s chain-steps",
                    r["n_samples"],
                    n_chunks,
                    r["chunk_size"],
                    s["burn_in"] + s["n_steps"],
                    s["burn_in"],
                    s["n_steps"],
                    f"{r['n_samples'] * (s['burn_in'] + s['n_steps']):,}",
                )
            metrics = chunks.stream_chunks(
                logged,
                r["n_samples"],
                r["chunk_size"],
                s["n_steps"],
                out / "chunks",
                initial=lambda size, g: _initial(config, energy, size, g, device),
                seed=r["seed"],
                device=device,
                burn_in=s["burn_in"],
                resume=resume,
                progress=progress,
                report_every=None if progress or quiet else REPORT_EVERY_S,
                **tunables,
            )
        else:
            sampling = time.perf_counter()
            if r["checkpoint_every"]:
                result = chunks.sample_in_segments(
                    logged,
                    x0,
                    s["n_steps"],
                    r["checkpoint_every"],
                    out,
                    burn_in=s["burn_in"],
                    thin=s["thin"],
                    generator=generator,
                    saved=saved,
                    progress=progress,
                    on_segment=lambda index: _after_segment(index),
                    metadata=step,
                    **tunables,
                )
                samples, trajectory, stats, d, local = (
                    result.samples,
                    result.trajectory,
                    result.stats,
                    result.diagnostics,
                    slice(None),
                )
                acceptance = None if d.acceptance_rate is None else float(d.acceptance_rate.mean())
                divergences, summary = None if d.divergences is None else int(d.divergences.sum()), None
            else:
                res = distributed.sample(
                    sampler,
                    s["n_chains"],
                    s["n_steps"],
                    world,
                    burn_in=s["burn_in"],
                    thin=s["thin"],
                    local_x0=x0,
                    generator=generator,
                    progress=progress,
                    return_stats=config["output"]["draws"] != "none",
                    **tunables,
                )
                samples, trajectory, local, stats = res.samples, res.trajectory, res.local, res.stats
                acceptance, divergences, summary = res.acceptance, res.divergences, res.summary
            metrics = run_report.metrics(
                samples, trajectory, s, time.perf_counter() - sampling, acceptance, divergences, summary, stats
            )
            metrics["draws_file"] = _save_draws(config, out, world, sampler, x0, tunables, trajectory, stats)
            if config["output"]["per_rank_samples"]:  # each rank writes its own shard: samples-rank<r>.{pt,npz}
                runfiles.save_samples(out, f"samples-rank{world.rank}", samples[local])
            elif world.is_main:
                runfiles.save_samples(out, "samples", samples)
            if config["output"]["plots"] and world.is_main:
                metrics["plots_skipped"] = run_report.plots(out, energy, trajectory, samples, quiet)
            elif not config["output"]["plots"]:
                metrics["plots_skipped"] = "[output] plots = false"
            metrics["warnings"] = run_report.warnings({**metrics, **step, "sampler": s["name"]})  # the fix depends on them
    finally:
        if live is not None:
            live.close()
    metrics.update(
        step,
        sampler=s["name"],
        energy=config["energy"]["name"] or config["energy"]["model"],
        wall_time_s=time.perf_counter() - start,
        device=str(device),
        kernel_backends=run_report.backends(energy, x0),
        **({"world_size": world.world_size} if world.active else {}),
    )
    if world.is_main:
        runfiles.write_json(out / "metrics.json", metrics)
    return metrics


class _Logged:
    """``sampler`` with each ``sample`` call (a chunk, a segment) written as a row of the live log, keyed by the next
    of ``keys``; everything else is the sampler's."""

    def __init__(self, sampler: ebmcore.Sampler, live: live_log.LiveLog, keys: Iterator[int], step_size: float | None) -> None:
        self.sampler, self.live, self.keys, self.step_size = sampler, live, keys, step_size

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sampler, name)

    def sample(self, x0: torch.Tensor, n_steps: int, **options: Any) -> Any:
        result = self.sampler.sample(x0, n_steps, **options)
        d = result.diagnostics
        self.live.row(
            next(self.keys),
            {
                "wall_time": time.time(),
                "n_chains": int(x0.shape[0]),
                "steps": options.get("burn_in", 0) + n_steps,
                "acceptance": None if d.acceptance_rate is None else float(d.acceptance_rate.float().mean()),
                "step_size": self.step_size,
                "energy_mean": float(d.energy.float().mean()) if d.energy.numel() else None,
                "divergences": None if d.divergences is None else int(d.divergences.sum()),
                "nonfinite_chains": int(d.nonfinite_chains.numel()),
                "sampling_s": d.wall_time,
            },
        )
        return result


def _live_log(
    config: dict[str, Any], out: Path, sampler: ebmcore.Sampler, saved: dict[str, Any] | None, resume: bool, step_size: Any
) -> tuple[live_log.LiveLog | None, Any]:
    """The open live log of ``[output] live_log`` and the sampler that writes it (None and ``sampler`` without one). A
    resumed run keeps the rows of the chunks (segments) already written and appends the others."""
    r = config["run"]
    live = live_log.LiveLog.from_config(config["output"]["live_log"], out, prefix="sample")
    if live is None:
        return None, sampler
    if r["n_samples"]:
        n_chunks = -(-r["n_samples"] // r["chunk_size"])
        todo = [k for k in range(n_chunks) if not (resume and (out / "chunks" / f"chunk-{k:05d}.npz").exists())]
        live.open(("chunk", *LOG_COLUMNS), after=(todo[0] - 1 if todo else n_chunks - 1) if resume else None)
        keys: Iterator[int] = iter(todo)
    else:
        done = saved["segments"] if saved is not None else 0
        live.open(("segment", *LOG_COLUMNS), after=done - 1 if saved is not None else None)
        keys = itertools.count(done)
    return live, _Logged(sampler, live, keys, None if step_size is None else float(step_size))


def _save_draws(
    config: dict[str, Any],
    out: Path,
    world: distributed.DistributedRun,
    sampler: ebmcore.Sampler,
    x0: torch.Tensor,
    tunables: dict[str, Any],
    trajectory: torch.Tensor,
    stats: dict[str, Any] | None,
) -> str | None:
    """Write the draws file of ``[output] draws`` (rank 0; every rank gathers the per-chain step sizes); its name."""
    if config["output"]["draws"] == "none":
        return None
    per_chain = {k: distributed.gather_chains(v, world) for k, v in draws.params_stats(sampler, x0, tunables).items()}
    metric_name, metric = draws.metric_arrays(sampler, x0, tunables)
    metric = {k: distributed.gather_chains(v, world) if v.shape == x0.shape else v for k, v in metric.items()}  # per chain
    if not world.is_main:
        return None
    attrs = {
        "sampler": config["sampler"]["name"],
        "energy": config["energy"]["name"] or config["energy"]["model"],
        "thin": config["sampler"]["thin"],
        "seed": config["run"]["seed"],
        **({"metric": metric_name} if metric_name else {}),
    }
    path = draws.save(out, config["output"]["draws"], draws.from_result(trajectory, stats, per_chain, attrs, metric))
    return path.name if path is not None else None


def _after_segment(index: int) -> None:
    """Called after each checkpointed segment (a seam for tests that simulate an interruption)."""


def add_command(subparsers: Any) -> None:
    p = subparsers.add_parser("sample", help=COMMANDS["sample"])
    ARGUMENTS["sample"](p)  # declared without torch, for `ebm sample --help` (ebmcore.commands)
    p.set_defaults(func=_main)


def _overrides(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    return {
        "sampler": {
            "name": args.sampler,
            "n_chains": args.n_chains,
            "n_steps": args.n_steps,
            "warmup": 0 if args.step_size is not None and args.warmup is None else args.warmup,
        },
        "run": {
            "device": args.device,
            "backend": args.backend,
            "seed": args.seed,
            "n_samples": args.n_samples,
            "chunk_size": args.chunk_size,
            "threads": args.threads,
        },
        "output": {"draws": args.draws_format},
    }


def _main(args: argparse.Namespace) -> int:
    config = load_config(args.config, _overrides(args))
    if args.step_size is not None:
        config["sampler"]["params"] = dict(config["sampler"]["params"], step_size=args.step_size)
    out = Path(args.out or config["output"]["dir"])
    metrics = run(config, out, resume=args.resume, overwrite=args.overwrite, quiet=args.quiet)
    if int(os.environ.get("RANK", "0")) == 0:
        print((smc_job.summary if metrics.get("sampler") == smc_job.NAME else run_report.summary)(metrics, out))
    if args.strict and metrics.get("nonfinite_chains"):
        print(f"error: --strict: {run_report.nonfinite_line(metrics)}; everything is written to {out}.", file=sys.stderr)
        return 1
    if args.strict and metrics.get("warnings"):
        n = len(metrics["warnings"])
        print(
            f"error: --strict: {n} warning{'s' if n > 1 else ''} (above, and in {out / 'metrics.json'}); everything is "
            f"written to {out}.",
            file=sys.stderr,
        )
        return 1
    return 0
