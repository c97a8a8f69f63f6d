"""``ebm sample``: sample an energy (a registered one or a model from ``ebm train``) with any
registered sampler, with warm-up, burn-in and thinning; write samples, metrics and plots to a run
directory. With ``n_samples > 0`` it streams chunks of independent chains to disk instead, with
bounded memory, and ``--resume`` skips the chunks already written.

The energy and the sampler are built once. A sampler of the core contract (``init``/``step``)
runs everywhere; what needs more (warm-up needs an acceptance statistic) is skipped with one line.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from importlib import resources
from pathlib import Path
from typing import Any

import torch

import ebmcore
from ebmcore import distributed, registry, runfiles
from ebmcore.config import load_job_config, parse_device
from ebmcore.errors import ConfigError

from ebm_samplers import chunks, run_report
from ebm_samplers.adaptation import cannot_warm_up, warmup
from ebm_samplers.params import event_size
from ebm_samplers.sampler import AlgorithmSampler

__all__ = ["SCHEMA", "load_config", "build_energy", "build", "run", "add_command"]

_positive = lambda v: None if v > 0 else "must be > 0"  # noqa: E731
_non_negative = lambda v: None if v >= 0 else "must be >= 0"  # noqa: E731

SCHEMA: dict[str, Any] = {  # the defaults are the bundled configuration's (a test keeps them equal)
    "energy": {"name": ((str,), ""), "params": ((dict,), {}), "model": ((str,), "")},
    "sampler": {
        "name": ((str,), "mala"),
        "params": ((dict,), {}),
        "n_chains": ((int, _positive), 1000),
        "n_steps": ((int, _positive), 500),
        "burn_in": ((int, _non_negative), 500),
        "thin": ((int, _positive), 1),
        "warmup": ((int, _non_negative), 300),
        "target_accept": ((float, lambda v: None if 0 < v < 1 else "must be in (0, 1)"), 0.6),
        "init_scale": ((float, int, _positive), 1.0),
    },
    "run": {
        "seed": ((int,), 0),
        "device": ((str,), "cpu"),
        "backend": ((str,), ""),
        "n_samples": ((int, _non_negative), 0),
        "chunk_size": ((int, _positive), 100_000),
        "checkpoint_every": ((int, _non_negative), 0),
    },
    "output": {"dir": ((str,), "runs/sample"), "plots": ((bool,), True), "per_rank_samples": ((bool,), False)},
}


def default_config_path() -> Path:
    return Path(str(resources.files("ebm_samplers") / "configs" / "sample_default.toml"))


def load_config(path: str | Path | None, overrides: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """Read and check a sample configuration (the bundled default without ``path``); ``overrides``
    (``{"table": {"key": value}}``, from command-line flags) are applied first."""
    path = Path(path) if path else default_config_path()
    config = load_job_config(path, SCHEMA, overrides)
    energy = config["energy"]
    if bool(energy["name"]) == bool(energy["model"]):
        raise ConfigError(f"{path} [energy]: give either 'name' (a registered energy) or 'model' (a file from ebm train), not both or neither.")
    if energy["model"] and energy["params"]:
        raise ConfigError(f"{path} [energy]: 'params' applies to 'name' only; a model file carries its own.")
    parse_device(config["run"]["device"], f"{path} [run] device")
    registry.get("sampler", config["sampler"]["name"])
    if energy["name"]:
        registry.get("energy", energy["name"])
    elif not Path(energy["model"]).is_file():
        raise ConfigError(f"{path} [energy] model: no such file {energy['model']!r}; train one with `ebm train`.")
    return config


def build_energy(spec: dict[str, Any], device: torch.device) -> ebmcore.EnergyModel:
    """The energy of an ``[energy]`` table, on ``device``."""
    if spec["model"]:
        saved = torch.load(spec["model"], map_location=device, weights_only=True)
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


def tune(config: dict[str, Any], sampler: ebmcore.Sampler, x0: torch.Tensor, generator: torch.Generator,
         quiet: bool) -> tuple[torch.Tensor, dict[str, Any], dict[str, Any]]:
    """Warm up where asked for and possible: ``(states, tunables to sample with, the step size that will run
    and where it came from)``. A given ``step_size`` runs as given unless ``warmup > 0``."""
    s = config["sampler"]
    given = s["params"].get("step_size")
    start = f"the given {given}" if given is not None else "the default"
    why_not = cannot_warm_up(sampler) if s["warmup"] else None
    if s["warmup"] and why_not is None:
        tuned = warmup(sampler, x0, s["warmup"], target_accept=s["target_accept"], generator=generator)
        tunables = {"step_size": tuned.step_size, **({"inv_mass": tuned.inv_mass} if tuned.inv_mass is not None else {})}
        source = f"adapted by {s['warmup']} warm-up steps (target acceptance {s['target_accept']}) from {start}"
        if not quiet:
            print(f"warm-up: {s['warmup']} steps, step size {float(torch.as_tensor(tuned.step_size).mean()):.4g}, "
                  f"acceptance {tuned.acceptance:.3f}", file=sys.stderr)
        return tuned.x, tunables, _step_size(sampler, x0, tunables, source)
    if why_not is not None and not quiet:
        print(f"warm-up skipped: {why_not}", file=sys.stderr)
    source = "given" if given is not None else f"the default of {s['name']} for d = {event_size(x0)}"
    return x0, {}, _step_size(sampler, x0, {}, source)


def _step_size(sampler: ebmcore.Sampler, x: torch.Tensor, tunables: dict[str, Any], source: str) -> dict[str, Any]:
    value = tunables.get("step_size", getattr(getattr(sampler, "params", None), "step_size", None))
    if isinstance(sampler, AlgorithmSampler) and hasattr(sampler.params, "step_size"):
        value = sampler.resolve(x, tunables).step_size
    value = None if value is None else float(torch.as_tensor(value, dtype=torch.float64).mean())
    return {"step_size": value, "step_size_source": source if value is not None else f"{source} (not reported by the sampler)"}


def _initial(config: dict[str, Any], energy: ebmcore.EnergyModel, size: int, generator: torch.Generator,
             device: torch.device) -> torch.Tensor:
    return config["sampler"]["init_scale"] * torch.randn((size, *(energy.event_shape or (2,))), generator=generator, device=device)


def run(config: dict[str, Any], out: Path, *, resume: bool = False, quiet: bool = False) -> dict[str, Any]:
    """Run a checked configuration into ``out``; returns the metrics (also in ``out/metrics.json``).

    Under ``torchrun`` (``WORLD_SIZE > 1``) the chains are sharded across the processes and rank 0
    writes the gathered samples, metrics and plots."""
    r = config["run"]
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and (r["n_samples"] or r["checkpoint_every"]):
        raise ConfigError("streaming (n_samples) and checkpoint_every are single-process features; run them without torchrun.")
    if r["n_samples"] and not resume and any((out / "chunks").glob("chunk-*.npz")):
        raise ConfigError(f"{out / 'chunks'} holds chunks already: pass --resume to continue that run, or choose another --out.")
    if not r["n_samples"] and r["checkpoint_every"] and not resume and (out / "checkpoint.pt").exists():
        raise ConfigError(f"{out / 'checkpoint.pt'} exists: pass --resume to continue that run, or choose another --out.")
    selection = tuple(b.strip() for b in r["backend"].split(",") if b.strip())
    with ebmcore.use_backend(*selection) if selection else contextlib.nullcontext():
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            return _run_distributed(config, out, quiet)
        return _run(config, out, torch.device(r["device"]), resume, quiet)


def _run(config: dict[str, Any], out: Path, device: torch.device, resume: bool, quiet: bool) -> dict[str, Any]:
    s, r = config["sampler"], config["run"]
    energy, sampler = build(config, device)
    out.mkdir(parents=True, exist_ok=True)
    runfiles.write_json(out / "config.json", config)
    generator = torch.Generator(device=device).manual_seed(r["seed"])
    progress = sys.stderr.isatty() and not quiet
    start = time.perf_counter()
    saved = chunks.load_checkpoint(out, device) if resume and not r["n_samples"] else None
    if saved is not None:  # the warm-up is behind the checkpoint
        x0, tunables, step = saved["x"], saved["tunables"], saved["metadata"]
    else:
        x0, tunables, step = tune(config, sampler, _initial(config, energy, s["n_chains"], generator, device), generator, quiet)
    if r["n_samples"]:
        directory = out / "chunks"
        directory.mkdir(exist_ok=True)

        def write(k: int, samples: torch.Tensor) -> None:
            runfiles.save_samples(directory, f"chunk-{k:05d}", samples)
            (directory / f"chunk-{k:05d}.pt").unlink()  # streaming keeps the numpy copy only

        metrics = chunks.stream_chunks(sampler, r["n_samples"], r["chunk_size"], s["n_steps"], burn_in=s["burn_in"],
                                       initial=lambda size, g: _initial(config, energy, size, g, device), write=write,
                                       seed=r["seed"], device=device, progress=progress,
                                       skip=lambda k: resume and (directory / f"chunk-{k:05d}.npz").exists(), **tunables)
    else:
        if r["checkpoint_every"]:
            result = chunks.sample_in_segments(sampler, x0, s["n_steps"], r["checkpoint_every"], out, burn_in=s["burn_in"],
                                               thin=s["thin"], generator=generator, saved=saved, progress=progress,
                                               on_segment=lambda index: _after_segment(index), metadata=step, **tunables)
        else:
            result = sampler.sample(x0, s["n_steps"], burn_in=s["burn_in"], thin=s["thin"], return_trajectory=True,
                            return_diagnostics=True, generator=generator, progress=progress, **tunables)
        runfiles.save_samples(out, "samples", result.samples)
        d = result.diagnostics
        metrics = run_report.metrics(result.samples, result.trajectory, s, d.wall_time, d.acceptance_rate, d.divergences)
        metrics["nonfinite_chains"] = int(d.nonfinite_chains.numel())
        if config["output"]["plots"]:
            run_report.plots(out, energy, result.trajectory, result.samples, quiet)
    metrics.update(step, sampler=s["name"], energy=config["energy"]["name"] or config["energy"]["model"],
                   wall_time_s=time.perf_counter() - start, device=str(device), kernel_backends=run_report.backends(energy, x0))
    runfiles.write_json(out / "metrics.json", metrics)
    return metrics


def _after_segment(index: int) -> None:
    """Called after each checkpointed segment (a seam for tests that simulate an interruption)."""


def _run_distributed(config: dict[str, Any], out: Path, quiet: bool) -> dict[str, Any]:
    s, r = config["sampler"], config["run"]
    use_cuda = r["device"].startswith("cuda")
    dist_run = distributed.init("nccl" if use_cuda else "gloo", device=None if use_cuda else "cpu")
    try:
        energy, sampler = build(config, dist_run.device)
        g = distributed.rank_generator(r["seed"], dist_run.rank, dist_run.device)
        part = distributed.shard(s["n_chains"], dist_run.rank, dist_run.world_size)
        start = time.perf_counter()
        x0 = _initial(config, energy, part.stop - part.start, g, dist_run.device)
        x0, tunables, step = tune(config, sampler, x0, g, quiet or not dist_run.is_main)
        res = distributed.sample(sampler, s["n_chains"], s["n_steps"], dist_run, burn_in=s["burn_in"], thin=s["thin"],
                                 local_x0=x0, generator=g, **tunables)
        wall = time.perf_counter() - start
        metrics = run_report.metrics(res.samples, res.trajectory, s, wall, None, None, summary=res.summary)
        metrics.update(step, acceptance=res.acceptance, divergences=res.divergences, world_size=dist_run.world_size,
                       sampler=s["name"], energy=config["energy"]["name"] or config["energy"]["model"], wall_time_s=wall,
                       device=str(dist_run.device), kernel_backends=run_report.backends(energy, x0))
        out.mkdir(parents=True, exist_ok=True)
        if config["output"]["per_rank_samples"]:  # each rank writes its own shard: samples-rank<r>.{pt,npz}
            runfiles.save_samples(out, f"samples-rank{dist_run.rank}", res.samples[res.local])
        if dist_run.is_main:
            runfiles.write_json(out / "config.json", config)
            if not config["output"]["per_rank_samples"]:
                runfiles.save_samples(out, "samples", res.samples)
            runfiles.write_json(out / "metrics.json", metrics)
            if config["output"]["plots"]:
                run_report.plots(out, energy, res.trajectory, res.samples, quiet)
        return metrics
    finally:
        distributed.shutdown(dist_run)


def add_command(subparsers: Any) -> None:
    p = subparsers.add_parser("sample", help="sample an energy with any registered sampler (bundled default config)")
    p.add_argument("config", nargs="?", help="a TOML configuration (default: the bundled sample_default.toml)")
    p.add_argument("--out", help="run directory (default: [output] dir)")
    p.add_argument("--device", help="torch device, e.g. cpu or cuda:0 (default: [run] device)")
    p.add_argument("--backend", help='kernel backend selection, e.g. "torch" or "cuda,torch"')
    p.add_argument("--seed", type=int, help="seed of the run's generator (default: [run] seed)")
    p.add_argument("--sampler", help="a registered sampler name (default: [sampler] name)")
    p.add_argument("--step-size", type=float, help="sample with this step size as given: no warm-up unless --warmup is given too")
    p.add_argument("--warmup", type=int, help="warm-up (adaptation) steps; 0 for none (default: [sampler] warmup)")
    p.add_argument("--n-chains", type=int, help="number of chains (default: [sampler] n_chains)")
    p.add_argument("--n-steps", type=int, help="kept steps after burn-in (default: [sampler] n_steps)")
    p.add_argument("--n-samples", type=int, help="stream this many samples to disk in chunks")
    p.add_argument("--chunk-size", type=int, help="chains per streamed chunk (default: [run] chunk_size)")
    p.add_argument("--resume", action="store_true", help="continue a streamed or checkpointed run where it stopped")
    p.add_argument("--quiet", action="store_true", help="print only the final summary")
    p.set_defaults(func=_main)


def _overrides(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    return {"sampler": {"name": args.sampler, "n_chains": args.n_chains, "n_steps": args.n_steps,
                        "warmup": 0 if args.step_size is not None and args.warmup is None else args.warmup},
            "run": {"device": args.device, "backend": args.backend, "seed": args.seed, "n_samples": args.n_samples,
                    "chunk_size": args.chunk_size}}


def _main(args: argparse.Namespace) -> int:
    config = load_config(args.config, _overrides(args))
    if args.step_size is not None:
        config["sampler"]["params"] = dict(config["sampler"]["params"], step_size=args.step_size)
    out = Path(args.out or config["output"]["dir"])
    metrics = run(config, out, resume=args.resume, quiet=args.quiet)
    if int(os.environ.get("RANK", "0")) == 0:
        print(run_report.summary(metrics, out))
    return 0
