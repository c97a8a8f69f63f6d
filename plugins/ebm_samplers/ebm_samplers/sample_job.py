"""``ebm sample``: sample an energy (a registered one or a model from ``ebm train``) with any
registered sampler, with warm-up, burn-in and thinning; write samples, metrics and plots to a run
directory. With ``n_samples > 0`` it streams chunks of independent chains to disk instead, with
bounded memory, and ``--resume`` skips the chunks already written.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import time
from importlib import resources
from pathlib import Path
from typing import Any

import torch

import ebmcore
from ebmcore import diagnostics, registry
from ebmcore.config import load_job_config, parse_device
from ebmcore.errors import ConfigError

from ebm_samplers import report
from ebm_samplers.adaptation import warmup

__all__ = ["SCHEMA", "load_config", "build_energy", "run", "add_command"]

_positive = lambda v: None if v > 0 else "must be > 0"  # noqa: E731
_non_negative = lambda v: None if v >= 0 else "must be >= 0"  # noqa: E731

SCHEMA: dict[str, Any] = {
    "energy": {
        "name": ((str,), ""),
        "params": ((dict,), {}),
        "model": ((str,), ""),
    },
    "sampler": {
        "name": ((str,), "nuts"),
        "params": ((dict,), {}),
        "n_chains": ((int, _positive), 1000),
        "n_steps": ((int, _positive), 500),
        "burn_in": ((int, _non_negative), 100),
        "thin": ((int, _positive), 1),
        "warmup": ((int, _non_negative), 0),
        "target_accept": ((float, lambda v: None if 0 < v < 1 else "must be in (0, 1)"), 0.8),
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
    "output": {
        "dir": ((str,), "runs/sample"),
        "plots": ((bool,), True),
        "per_rank_samples": ((bool,), False),
    },
}


def default_config_path() -> Path:
    return Path(str(resources.files("ebm_samplers") / "configs" / "sample_default.toml"))


def load_config(path: str | Path | None, overrides: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """Read and validate a sample configuration (the bundled default without ``path``); ``overrides``
    (``{"table": {"key": value}}``, from command-line flags) are applied before validation."""
    path = Path(path) if path else default_config_path()
    config = load_job_config(path, SCHEMA, overrides)
    energy = config["energy"]
    if bool(energy["name"]) == bool(energy["model"]):
        raise ConfigError(f"{path} [energy]: give either 'name' (a registered energy) or 'model' (a file from ebm train), not both or neither.")
    if energy["model"] and energy["params"]:
        raise ConfigError(f"{path} [energy]: 'params' applies to 'name' only; a model file carries its own.")
    # everything that can be checked is checked now, before any work or any file is written
    parse_device(config["run"]["device"], f"{path} [run] device")
    registry.get("sampler", config["sampler"]["name"])
    if energy["name"]:
        registry.get("energy", energy["name"])
    elif not Path(energy["model"]).is_file():
        raise ConfigError(f"{path} [energy] model: no such file {energy['model']!r}; train one with `ebm train`.")
    try:
        built = build_energy(energy, torch.device("cpu"))
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{path} [energy]: {exc}") from None
    try:
        sampler = registry.get("sampler", config["sampler"]["name"])(built, **config["sampler"]["params"])
        if hasattr(sampler, "tunables"):  # step sizes, tree depth, mass matrix: checked on a dummy state
            sampler.tunables(torch.zeros((2, *(built.event_shape or (2,))), dtype=_param_dtype(built)), {})
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{path} [sampler] params: {exc}") from None
    return config


def _param_dtype(energy: ebmcore.EnergyModel) -> torch.dtype:
    ref = energy._reference_tensor()
    return ref.dtype if ref is not None else torch.get_default_dtype()


def build_energy(spec: dict[str, Any], device: torch.device) -> ebmcore.EnergyModel:
    """The energy of an ``[energy]`` table, on ``device``."""
    if spec["model"]:
        saved = torch.load(spec["model"], map_location=device, weights_only=True)
        energy = registry.get("energy", saved["energy"])(**saved["params"])
        energy.load_state_dict(saved["state_dict"])
        return energy.to(device)
    return registry.get("energy", spec["name"])(**spec["params"]).to(device)


def _tuned(config: dict[str, Any], sampler: Any, energy: ebmcore.EnergyModel, device: torch.device,
           generator: torch.Generator, quiet: bool) -> tuple[torch.Tensor, dict[str, Any]]:
    """Initial states and the tuned tunables (after warm-up, if asked for and possible)."""
    s = config["sampler"]
    d = energy.event_shape or (2,)
    x0 = s["init_scale"] * torch.randn((s["n_chains"], *d), generator=generator, device=device)
    if s["warmup"] and getattr(sampler, "has_acceptance", False):
        tuned = warmup(sampler, x0, s["warmup"], target_accept=s["target_accept"], generator=generator)
        extra = {"step_size": tuned.step_size}
        if tuned.inv_mass is not None:
            extra["inv_mass"] = tuned.inv_mass
        if not quiet:
            print(f"warm-up: {s['warmup']} steps, step size {float(torch.as_tensor(tuned.step_size).mean()):.4g}, "
                  f"acceptance {tuned.acceptance:.3f}", file=sys.stderr)
        return tuned.x, extra
    return x0, {}


def _backends(energy: ebmcore.EnergyModel, sampler_name: str, like: torch.Tensor) -> dict[str, str]:
    ops = []
    if isinstance(energy, ebmcore.AnalyticEnergy):
        ops = [f"{energy.op}_energy", f"{energy.op}_gradient"]
    if sampler_name in ("langevin",):
        ops.append("langevin_step")
    return {op: ebmcore.explain(op, like).chosen.backend for op in ops if ebmcore.explain(op, like).chosen}


def run(config: dict[str, Any], out: Path, *, resume: bool = False, quiet: bool = False) -> dict[str, Any]:
    """Run a validated configuration into ``out``; returns the metrics (also in ``out/metrics.json``).

    Under ``torchrun`` (``WORLD_SIZE > 1``) the chains are sharded across the processes and rank 0
    writes the gathered samples, metrics and plots."""
    device = torch.device(config["run"]["device"])
    selection = tuple(b.strip() for b in config["run"]["backend"].split(",") if b.strip())
    with ebmcore.use_backend(*selection) if selection else contextlib.nullcontext():
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            return _run_distributed(config, out, quiet)
        return _run(config, out, device, resume, quiet)


def _run_distributed(config: dict[str, Any], out: Path, quiet: bool) -> dict[str, Any]:
    from ebm_samplers import distributed

    s, r = config["sampler"], config["run"]
    if r["n_samples"] or r["checkpoint_every"]:
        raise ConfigError("streaming (n_samples) and checkpoint_every are single-process features; run them without torchrun.")
    use_cuda = r["device"].startswith("cuda")
    run = distributed.init("nccl" if use_cuda else "gloo", device=None if use_cuda else "cpu")
    try:
        energy = build_energy(config["energy"], run.device)
        sampler = registry.get("sampler", s["name"])(energy, **s["params"])
        g = distributed.rank_generator(r["seed"], run.rank, run.device)
        local = dict(config, sampler=dict(s, n_chains=len(range(*distributed.shard(s["n_chains"], run.rank, run.world_size).indices(s["n_chains"])))))
        start = time.perf_counter()
        x0, tuned = _tuned(local, sampler, energy, run.device, g, quiet or not run.is_main)
        res = distributed.sample(sampler, s["n_chains"], s["n_steps"], run, burn_in=s["burn_in"], thin=s["thin"],
                                 local_x0=x0, generator=g, **tuned)
        wall = time.perf_counter() - start
        metrics: dict[str, Any] = {
            "n_chains": res.samples.shape[0], "n_kept": res.trajectory.shape[0], "world_size": run.world_size,
            "mean": res.samples.double().mean(0).flatten().tolist(),
            "ess_bulk_min": float(res.summary["ess_bulk"].min()) if res.summary else None,
            "ess_tail_min": float(res.summary["ess_tail"].min()) if res.summary else None,
            "r_hat_max": float(res.summary["r_hat"].max()) if res.summary else None,
            "acceptance": res.acceptance, "divergences": res.divergences,
            "sampler": s["name"], "energy": config["energy"]["name"] or config["energy"]["model"],
            "wall_time_s": wall, "device": str(run.device), "kernel_backends": _backends(energy, s["name"], x0),
            "throughput_chain_steps_per_s": res.samples.shape[0] * (s["n_steps"] + s["burn_in"]) / wall,
        }
        out.mkdir(parents=True, exist_ok=True)
        if config["output"]["per_rank_samples"]:  # each rank writes its own shard: samples-rank<r>.{pt,npz}
            report.save_samples(out, f"samples-rank{run.rank}", res.samples[res.local])
        if run.is_main:
            report.write_json(out / "config.json", config)
            if not config["output"]["per_rank_samples"]:
                report.save_samples(out, "samples", res.samples)
            report.write_json(out / "metrics.json", metrics)
            if config["output"]["plots"]:
                from types import SimpleNamespace

                _plots(out, energy, SimpleNamespace(trajectory=res.trajectory, samples=res.samples))
        return metrics
    finally:
        distributed.shutdown(run)


def _run(config: dict[str, Any], out: Path, device: torch.device, resume: bool, quiet: bool) -> dict[str, Any]:
    if config["run"]["n_samples"] and not resume and any((out / "chunks").glob("chunk-*.npz")):
        raise ConfigError(f"{out / 'chunks'} holds chunks already: pass --resume to continue that run, or choose another --out.")
    if not config["run"]["n_samples"] and config["run"]["checkpoint_every"] and not resume and (out / "checkpoint.pt").exists():
        raise ConfigError(f"{out / 'checkpoint.pt'} exists: pass --resume to continue that run, or choose another --out.")
    out.mkdir(parents=True, exist_ok=True)
    report.write_json(out / "config.json", config)
    s, r = config["sampler"], config["run"]
    energy = build_energy(config["energy"], device)
    sampler = registry.get("sampler", s["name"])(energy, **s["params"])
    generator = torch.Generator(device=device).manual_seed(r["seed"])
    progress = sys.stderr.isatty() and not quiet
    start = time.perf_counter()
    checkpoint = out / "checkpoint.pt"
    if resume and not r["n_samples"] and checkpoint.exists():
        saved = torch.load(checkpoint, map_location=device, weights_only=True)
        x0, tuned = saved["x"], saved["tuned"]
        generator.set_state(saved["generator"])
    else:
        saved = None
        x0, tuned = _tuned(config, sampler, energy, device, generator, quiet)
    if r["n_samples"]:
        metrics = _stream(config, out, sampler, energy, tuned, device, resume, progress)
    else:
        if r["checkpoint_every"]:
            result = _segments(config, out, sampler, x0, tuned, generator, progress, saved)
        else:
            result = sampler.sample(x0, s["n_steps"], burn_in=s["burn_in"], thin=s["thin"], return_trajectory=True,
                                    return_diagnostics=True, generator=generator, progress=progress, **tuned)
        report.save_samples(out, "samples", result.samples)
        metrics = _metrics(result, s)
        if config["output"]["plots"]:
            _plots(out, energy, result)
    metrics.update({
        "sampler": s["name"],
        "energy": config["energy"]["name"] or config["energy"]["model"],
        "wall_time_s": time.perf_counter() - start,
        "device": str(device),
        "kernel_backends": _backends(energy, s["name"], x0),
        "tuned": {k: (float(torch.as_tensor(v).mean()) if k == "step_size" else v) for k, v in tuned.items()},
    })
    report.write_json(out / "metrics.json", metrics)
    return metrics


def _after_segment(index: int) -> None:
    """Called after each checkpointed segment (a seam for tests that simulate an interruption)."""


def _segments(config: dict[str, Any], out: Path, sampler: Any, x: torch.Tensor, tuned: dict[str, Any],
              generator: torch.Generator, progress: bool, saved: dict[str, Any] | None) -> Any:
    """Sample in segments of ``checkpoint_every`` kept draws, checkpointing the chains and the generator
    after each one, so that ``--resume`` continues exactly (the draws are those of one uninterrupted run)."""
    from ebm_samplers.base import Diagnostics, SampleResult

    s, every = config["sampler"], config["run"]["checkpoint_every"]
    thin, total = s["thin"], s["n_steps"] // s["thin"]
    parts_dir = out / "segments"
    parts_dir.mkdir(exist_ok=True)
    done, index = (saved["kept"], saved["segments"]) if saved else (0, 0)
    burn_in = 0 if saved else s["burn_in"]
    while done < total:
        k = min(every, total - done)
        steps = k * thin if done + k < total else s["n_steps"] - done * thin  # the last segment takes the remainder
        result = sampler.sample(x, steps, burn_in=burn_in, thin=thin, return_trajectory=True, return_diagnostics=True,
                                generator=generator, progress=progress, **tuned)
        d = result.diagnostics
        torch.save({"trajectory": result.trajectory, "mean": d.mean, "variance": d.variance, "energy": d.energy,
                    "acceptance": d.acceptance, "accepted": None if d.acceptance_rate is None else d.acceptance_rate * steps,
                    "divergences": d.divergences, "wall_time": d.wall_time, "steps": steps}, parts_dir / f"segment-{index:05d}.pt")
        x, done, index, burn_in = result.samples, done + k, index + 1, 0
        tmp = out / "checkpoint.pt.tmp"
        torch.save({"x": x, "kept": done, "segments": index, "generator": generator.get_state(), "tuned": tuned}, tmp)
        tmp.replace(out / "checkpoint.pt")
        _after_segment(index)
    parts = [torch.load(parts_dir / f"segment-{i:05d}.pt", weights_only=True) for i in range(index)]
    cat = lambda key: None if parts[0][key] is None else torch.cat([p[key] for p in parts])  # noqa: E731
    steps = sum(p["steps"] for p in parts)
    accepted = None if parts[0]["accepted"] is None else sum(p["accepted"] for p in parts) / max(steps, 1)
    divergences = None if parts[0]["divergences"] is None else sum(p["divergences"] for p in parts)
    nonfinite = (~torch.isfinite(x.flatten(1)).all(1)).nonzero().flatten()
    diagnostics = Diagnostics(cat("mean"), cat("variance"), cat("energy"), cat("acceptance"), accepted, divergences,
                              nonfinite, sum(p["wall_time"] for p in parts))
    return SampleResult(x, cat("trajectory"), diagnostics)


def _metrics(result: Any, s: dict[str, Any]) -> dict[str, Any]:
    traj = result.trajectory
    d = result.diagnostics
    chain_steps = traj.shape[1] * (s["n_steps"] + s["burn_in"])
    metrics: dict[str, Any] = {
        "n_chains": traj.shape[1],
        "n_kept": traj.shape[0],
        "mean": result.samples.double().mean(0).flatten().tolist(),
        "ess_bulk_min": None,
        "ess_tail_min": None,
        "r_hat_max": None,
        "throughput_chain_steps_per_s": chain_steps / max(d.wall_time, 1e-9),
        "sampling_time_s": d.wall_time,
        "nonfinite_chains": int(d.nonfinite_chains.numel()),
    }
    if traj.shape[0] >= 4:
        metrics["ess_bulk_min"] = float(diagnostics.ess_bulk(traj).min())
        metrics["ess_tail_min"] = float(diagnostics.ess_tail(traj).min())
        metrics["r_hat_max"] = float(diagnostics.split_rhat(traj).max())
    if d.acceptance_rate is not None:
        metrics["acceptance"] = float(d.acceptance_rate.mean())
        metrics["divergences"] = int(d.divergences.sum())
    return metrics


def _plots(out: Path, energy: ebmcore.EnergyModel, result: Any) -> None:
    traj = result.trajectory
    if traj.dim() == 3 and traj.shape[2] == 2:
        energy_fn = lambda g: energy.compute_energy(g.to(traj.dtype)).double()  # noqa: E731
        report.plot_landscape(out / "landscape.png", energy_fn, result.samples, "energy landscape and samples")
    report.plot_traces(out / "trace.png", traj)
    if traj.shape[0] >= 4:
        report.plot_autocorrelation(out / "autocorrelation.png", diagnostics.autocorrelation(traj, max_lag=min(100, traj.shape[0] - 1)))


def _stream(config: dict[str, Any], out: Path, sampler: Any, energy: ebmcore.EnergyModel, tuned: dict[str, Any],
            device: torch.device, resume: bool, progress: bool) -> dict[str, Any]:
    """Independent chunks of ``chunk_size`` chains, each seeded by (seed, chunk), written as ``chunks/chunk-NNNNN.npz``."""
    s, r = config["sampler"], config["run"]
    chunks = out / "chunks"
    chunks.mkdir(exist_ok=True)
    n_chunks = math.ceil(r["n_samples"] / r["chunk_size"])
    d = energy.event_shape or (2,)
    written = skipped = written_samples = 0
    acceptance = []
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=n_chunks, desc="chunks", unit="chunk")
    sampling = 0.0
    for k in range(n_chunks):
        name = f"chunk-{k:05d}"
        size = min(r["chunk_size"], r["n_samples"] - k * r["chunk_size"])
        if resume and (chunks / f"{name}.npz").exists():
            skipped += 1
        else:
            g = torch.Generator(device=device).manual_seed(r["seed"] * 1_000_003 + k + 1)
            x0 = s["init_scale"] * torch.randn((size, *d), generator=g, device=device)
            t = time.perf_counter()
            result = sampler.sample(x0, s["n_steps"], burn_in=s["burn_in"], return_diagnostics=True, generator=g, **tuned)
            sampling += time.perf_counter() - t
            report.save_samples(chunks, name, result.samples)
            (chunks / f"{name}.pt").unlink()  # streaming keeps the numpy copy only
            if result.diagnostics.acceptance_rate is not None:
                acceptance.append(float(result.diagnostics.acceptance_rate.mean()))
            written += 1
            written_samples += size
            del result
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    return {
        "n_samples": r["n_samples"],
        "n_chunks": n_chunks,
        "chunks_written": written,
        "chunks_resumed": skipped,
        "sampling_time_s": sampling,
        "throughput_samples_per_s": written_samples / sampling if sampling else None,
        "acceptance": sum(acceptance) / len(acceptance) if acceptance else None,
    }


def summary(metrics: dict[str, Any], out: Path) -> str:
    where = metrics["device"] + (f" x {metrics['world_size']} processes" if metrics.get("world_size", 1) > 1 else "")
    lines = [f"{metrics['sampler']} on {metrics['energy']} ({where}): {metrics['wall_time_s']:.1f} s"]
    if "n_chunks" in metrics:
        lines.append(f"  {metrics['n_samples']} samples in {metrics['n_chunks']} chunks "
                     f"({metrics['chunks_resumed']} resumed) -> {out / 'chunks'}")
        if metrics.get("acceptance") is not None:
            lines.append(f"  acceptance {metrics['acceptance']:.3f}")
        lines.append(f"  metrics: {out / 'metrics.json'}")
        return "\n".join(lines)
    ess = "" if metrics["ess_bulk_min"] is None else (
        f"; ESS bulk min {metrics['ess_bulk_min']:.0f}, tail min {metrics['ess_tail_min']:.0f}, R-hat max {metrics['r_hat_max']:.3f}")
    lines.append(f"  {metrics['n_chains']} chains x {metrics['n_kept']} kept draws{ess}")
    if metrics.get("acceptance") is not None:
        lines.append(f"  acceptance {metrics['acceptance']:.3f}, divergences {metrics.get('divergences', 0)}")
    lines.append(f"  metrics: {out / 'metrics.json'}; plots and samples in {out}")
    return "\n".join(lines)


def add_command(subparsers: Any) -> None:
    p = subparsers.add_parser("sample", help="sample an energy with any registered sampler (bundled default config)")
    p.add_argument("config", nargs="?", help="a TOML configuration (default: the bundled sample_default.toml)")
    p.add_argument("--out", help="run directory (default: [output] dir)")
    p.add_argument("--device")
    p.add_argument("--backend", help='kernel backend selection, e.g. "torch" or "cuda,torch"')
    p.add_argument("--seed", type=int)
    p.add_argument("--sampler", help="a registered sampler name")
    p.add_argument("--n-chains", type=int)
    p.add_argument("--n-steps", type=int)
    p.add_argument("--n-samples", type=int, help="stream this many samples to disk in chunks")
    p.add_argument("--chunk-size", type=int)
    p.add_argument("--resume", action="store_true", help="continue a streamed run, skipping chunks already written")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    config = load_config(args.config, {
        "sampler": {"name": args.sampler, "n_chains": args.n_chains, "n_steps": args.n_steps},
        "run": {"device": args.device, "backend": args.backend, "seed": args.seed, "n_samples": args.n_samples,
                "chunk_size": args.chunk_size},
    })
    out = Path(args.out or config["output"]["dir"])
    metrics = run(config, out, resume=args.resume, quiet=args.quiet)
    if int(os.environ.get("RANK", "0")) == 0:
        print(summary(metrics, out))
    return 0
