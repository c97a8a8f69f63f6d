"""``ebm train``: train an energy on a toy set, a tensor file or images (``.npz``/``.pt`` arrays, a folder of PNG
files, scikit-learn's digits) with any registered loss; write checkpoints, the model, metrics (with an AIS
estimate of the held-out log-likelihood) and plots to a run directory; ``--resume`` continues exactly."""

from __future__ import annotations

import argparse
import contextlib
import difflib
import logging
import os
import sys
import time
import zipfile
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import torch

import ebmcore
from ebmcore import registry, runfiles
from ebmcore.config import load_job_config, non_negative, parse_device, positive, seed_range, thread_count
from ebmcore.errors import ConfigError, InputError
from ebmcore.threads import job_threads

from ebm_losses import datasets, images
from ebm_losses.commands import ARGUMENTS, COMMANDS, bundled_config_names
from ebm_losses.train_report import grid_nll, held_out_report, summary
from ebm_losses.training import LiveLog, Trainer
from ebm_losses.watchdog import Watchdog

log = logging.getLogger(__name__)

__all__ = ["SCHEMA", "load_config", "run", "add_command", "grid_nll", "held_out_report"]


SCHEMA: dict[str, Any] = {
    "data": {
        "dataset": (
            (
                str,
                lambda v: (
                    None
                    if v in datasets.DATASETS
                    or v == images.DIGITS
                    or v.endswith((".pt", ".npz", ".bin"))
                    or Path(v).is_dir()
                    or Path(v).name == images.CIFAR_FOLDER
                    else f"must be one of {', '.join(datasets.DATASETS)}, {images.DIGITS}, a .pt/.npz file, a folder of PNG files "
                    f"or CIFAR-10's binary batches (a {images.CIFAR_FOLDER} folder or a .bin file)"
                ),
            ),
            "eight_gaussians",
        ),
        "pixel_range": (
            (
                list,
                lambda v: (
                    None
                    if not v or (len(v) == 2 and all(isinstance(b, (int, float)) for b in v) and v[1] > v[0])
                    else "must be [low, high] with high > low, or []"
                ),
            ),
            [],
        ),
        "dequantize": ((bool,), False),
        "n_train": ((int, positive), 8000),
        "n_test": ((int, positive), 2000),
        "seed": ((int, seed_range), 0),
    },
    "model": {"energy": ((str,), "mlp"), "params": ((dict,), {})},
    "loss": {"name": ((str,), "persistent_contrastive_divergence"), "params": ((dict,), {})},
    "train": {
        "steps": ((int, positive), 2000),
        "batch_size": ((int, positive), 256),
        "lr": ((float, positive), 2e-3),
        "ema_decay": ((float, int, lambda v: None if 0 <= v < 1 else "must be in [0, 1)"), 0.0),
        "clip_grad_norm": ((float, int, non_negative), 0.0),
        "threads": ((int, thread_count), 1),
        "eval_every": ((int, positive), 250),
        "checkpoint_every": ((int, positive), 250),
        "seed": ((int, seed_range), 0),
        "device": ((str,), "cpu"),
        "backend": ((str,), ""),
        "watchdog": ((bool, dict), True),
        "live_log": ((bool, dict, LiveLog.config_problem), False),  # log.csv (and TensorBoard) as it trains
    },
    "output": {
        "dir": ((str,), "runs/train"),
        "plots": ((bool,), True),
        "n_model_samples": ((int, non_negative), 4000),
        "sampler": ((str,), "mala"),
        "sampler_params": ((dict,), {}),
        "image_sample_steps": ((int, non_negative), 100),
        "denoise": ((bool,), False),
        "image_samples": ((int, positive), 100),
        "ais_chains": ((int, non_negative), 256),
        "ais_temperatures": ((int, positive), 500),
        "smc_particles": ((int, non_negative), 0),  # > 0: a third log Z by adaptive tempered SMC (dequantised images)
        "class_samples": ((int, positive), 40),  # a loss that trains p(y|x) (jem): class-conditional samples per class
        "class_sample_steps": ((int, non_negative), 200),
    },
}


def default_config_path() -> Path:
    return Path(str(resources.files("ebm_losses") / "configs" / "train_default.toml"))


def bundled_config_path(name: str) -> Path | None:
    """The bundled configuration ``train_<name>.toml`` (``ebm train digits``), or None."""
    path = Path(str(resources.files("ebm_losses") / "configs" / f"train_{name}.toml"))
    return path if name.isidentifier() and path.is_file() else None


def _missing_config(path: str) -> ConfigError:
    """The error for a ``CONFIG`` that is neither a file nor a bundled name: the bundled names, and the closest."""
    names = bundled_config_names()
    close = difflib.get_close_matches(Path(path).stem.removeprefix("train_"), names, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return ConfigError(
        f"{path}: no such configuration file, nor a bundled configuration of that name.{hint} "
        f"The bundled configurations (ebm train NAME): {', '.join(names)}."
    )


def load_config(path: str | Path | None, overrides: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """Read and validate a training configuration: a file, the name of a bundled one (``digits``), or the bundled
    default without ``path``."""
    if path and not Path(path).exists():
        if bundled_config_path(str(path)) is None:
            raise _missing_config(str(path))
        path = bundled_config_path(str(path))
    path = Path(path) if path else default_config_path()
    config = load_job_config(path, SCHEMA, overrides)
    # everything that can be checked is checked now, before any work or any file is written; the data first (the
    # first thing to fix, e.g. for `ebm train cifar10` on a CPU machine: the download, then the device)
    dataset = config["data"]["dataset"]
    missing = None
    if dataset not in datasets.DATASETS and dataset != images.DIGITS and not Path(dataset).exists():
        hint = (
            f" It is CIFAR-10's binary version: download cifar-10-binary.tar.gz from {images.CIFAR_URL}, unpack it in "
            f"the folder you run from (tar xzf cifar-10-binary.tar.gz), or set [data] dataset to the path of its "
            f"{images.CIFAR_FOLDER} folder."
            if Path(dataset).name == images.CIFAR_FOLDER or dataset.endswith(".bin")
            else ""
        )
        missing = f"{path} [data] dataset: no such file {dataset!r}.{hint}"
    try:
        parse_device(config["train"]["device"], f"{path} [train] device")
    except ConfigError as exc:
        if missing is not None:
            raise ConfigError(f"{missing} Then: {exc}") from None
        raise
    if missing is not None:
        raise ConfigError(missing)
    if config["data"]["dequantize"] and not images.is_image_source(dataset):
        raise ConfigError(
            f"{path} [data] dequantize: only images on a grid of levels are dequantised, not {dataset!r}; set dequantize = false."
        )
    try:
        Watchdog.from_config(config["train"]["watchdog"])
    except InputError as exc:
        raise ConfigError(f"{path} [train] watchdog: {exc}") from None
    built = {}
    for table, kind, key in (("model", "energy", "energy"), ("loss", "loss", "name")):
        factory = registry.get(kind, config[table][key])
        try:
            built[table] = factory(**config[table]["params"])
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{path} [{table}] params: {exc}") from None
    if getattr(built["loss"], "needs_labels", False) and dataset != images.DIGITS:
        raise ConfigError(f'{path} [loss] {config["loss"]["name"]} trains p(y|x) on labels: set [data] dataset = "digits".')
    try:  # the report's sampler, on the model: checked now rather than after the training
        report_sampler = registry.get("sampler", config["output"]["sampler"])(
            built["model"], **config["output"]["sampler_params"]
        )
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{path} [output] sampler_params: {exc}") from None
    if config["output"]["denoise"] and not getattr(report_sampler, "options", {}).get("sigmas"):
        raise ConfigError(
            f"{path} [output] denoise: the final denoising step needs a sampler with noise levels; set "
            f"[output] sampler = \"annealed_langevin\" (not {config['output']['sampler']!r}), or denoise = false."
        )
    return config


def _data(spec: dict[str, Any], source: str = "") -> tuple[torch.Tensor, torch.Tensor]:
    name = spec["dataset"]
    if name in datasets.DATASETS:
        g = torch.Generator().manual_seed(spec["seed"])
        return datasets.make(name, spec["n_train"], generator=g), datasets.make(name, spec["n_test"], generator=g)
    values = _load_points(Path(name), f"{source} [data] dataset".lstrip())
    n_test = min(spec["n_test"], values.shape[0] // 5)
    return values[n_test:], values[:n_test]


def _load_points(path: Path, where: str) -> torch.Tensor:
    """The points of a ``[data] dataset`` file: a tensor ``(N, *event_shape)`` in a ``.pt``, or the array ``samples``
    of an ``.npz``; anything else is a :class:`ConfigError` saying how to write the file."""
    where = f"{where} {str(path)!r}"
    if not path.is_file():
        raise ConfigError(f"{where}: no such file.")
    if path.suffix == ".pt":
        values = runfiles.load_torch(path, what="a tensor of points", fix="write it with torch.save(points, path)")
        if not isinstance(values, torch.Tensor):
            held = f"a dict with keys {', '.join(map(str, values))}" if isinstance(values, dict) else f"a {type(values).__name__}"
            raise ConfigError(
                f"{where} holds {held}, not a tensor; save the points alone: torch.save(points, path), "
                "points of shape (N, *event_shape)."
            )
    else:
        try:
            with np.load(path, allow_pickle=False) as archive:
                names = archive.files
                array = archive["samples"] if "samples" in names else None
        except ValueError as exc:  # an object (pickled) array
            raise ConfigError(
                f"{where}: {exc}; write numeric points with numpy.savez(path, samples=points.astype('float32'))."
            ) from None
        except (OSError, EOFError, zipfile.BadZipFile) as exc:  # not an npz, or truncated
            raise ConfigError(
                f"{where} is not a readable .npz ({exc}); write it with numpy.savez(path, samples=points)."
            ) from None
        if array is None:
            raise ConfigError(
                f"{where} has no array 'samples' (it holds {', '.join(names) or 'none'}); "
                "write it with numpy.savez(path, samples=points)."
            )
        if array.dtype.kind not in "fiu":
            raise ConfigError(
                f"{where}: 'samples' has dtype {array.dtype}; the points must be numbers, e.g. "
                "numpy.savez(path, samples=points.astype('float32'))."
            )
        values = torch.from_numpy(array)
    if values.is_complex() or values.dtype == torch.bool:
        raise ConfigError(f"{where} holds a {values.dtype} tensor; the points must be real numbers.")
    if values.dim() < 2 or values.shape[0] < 2:
        raise ConfigError(
            f"{where} holds points of shape {tuple(values.shape)}; give at least 2 points of shape "
            "(N, *event_shape), e.g. (N, 2) for 2-d points."
        )
    return values.float()


def run(
    config: dict[str, Any], out: Path, *, resume: bool = False, overwrite: bool = False, quiet: bool = False
) -> dict[str, Any]:
    """Train into ``out``. A training of this same configuration that finished in ``out`` is not run again (its
    metrics are returned, after one line) unless ``overwrite``, which starts afresh. Under ``torchrun`` every
    process trains its shard of each global batch (data parallel, gradients averaged) and rank 0 writes the run
    directory."""
    from ebmcore import distributed

    finished = runfiles.reuse_or_clear(
        out,
        config,
        lambda metrics: ["model.pt", "checkpoint.pt"],
        resume=resume,
        overwrite=overwrite,
        what="training",
        again="train again, --steps N --resume to train longer",
    )
    if finished is not None:
        return finished
    dist_run = None
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        use_cuda = config["train"]["device"].startswith("cuda")
        dist_run = distributed.init("nccl" if use_cuda else "gloo", device=None if use_cuda else "cpu")
        config = dict(config, train=dict(config["train"], device=str(dist_run.device)))
    try:
        with job_threads(config["train"]["threads"]):
            return _run(
                config,
                out,
                resume,
                quiet or (dist_run is not None and not dist_run.is_main),
                dist_run is None or dist_run.is_main,
            )
    finally:
        if dist_run is not None:
            distributed.shutdown(dist_run)


def _run(config: dict[str, Any], out: Path, resume: bool, quiet: bool, main: bool) -> dict[str, Any]:
    from ebmcore import plotting

    selection = tuple(b.strip() for b in config["train"]["backend"].split(",") if b.strip())
    device = torch.device(config["train"]["device"])
    checkpoint = out / "checkpoint.pt"
    if checkpoint.exists() and not resume:
        raise ConfigError(
            f"{checkpoint} exists: pass --resume to continue that run, --overwrite to start it afresh, or choose another --out."
        )
    if resume and not checkpoint.exists():
        raise ConfigError(f"--resume: no checkpoint at {checkpoint}.")
    is_images = images.is_image_source(config["data"]["dataset"])
    grid: dict[str, Any] = {}  # the levels and bin width of dequantised images ([data] dequantize)
    if is_images:
        train, test, pixel_range = _image_data(config["data"], grid)
        train, test = train.to(device), test.to(device)
    else:
        train, test = (t.to(device) for t in _data(config["data"], config["source"]))
    runfiles.make_dir(out)
    if main:
        runfiles.start_run(out, config)
    energy = registry.get("energy", config["model"]["energy"])(**config["model"]["params"]).to(device)
    if callable(getattr(energy, "fit_base", None)):  # a base density fitted to the training split (gaussian_residual)
        energy.fit_base(train)
    loss = registry.get("loss", config["loss"]["name"])(**config["loss"]["params"])
    t = config["train"]
    lim = float(train.abs().max()) * 1.25 if train.dim() == 2 and train.shape[1] == 2 else 0.0
    evaluate = (lambda e, step: {"held_out_nll": grid_nll(e, test, lim)}) if lim else (lambda e, step: {})
    trainer = Trainer(
        energy,
        loss,
        train,
        batch_size=t["batch_size"],
        lr=t["lr"],
        seed=t["seed"],
        ema_decay=t["ema_decay"] or None,
        clip_grad_norm=t["clip_grad_norm"] or None,
        progress=sys.stderr.isatty() and not quiet,
        eval_fn=evaluate,
        eval_every=t["eval_every"],
        checkpoint_path=checkpoint,
        checkpoint_every=t["checkpoint_every"],
        watchdog=Watchdog.from_config(t["watchdog"]) or False,
        live_log=LiveLog.from_config(t["live_log"], out),
        labels=_digit_labels(config["data"]).to(device) if getattr(loss, "needs_labels", False) else None,
    )
    if resume:
        trainer.load(checkpoint)
    start, first_step = time.perf_counter(), trainer.step
    with ebmcore.use_backend(*selection) if selection else contextlib.nullcontext():
        trainer.fit(max(t["steps"] - trainer.step, 0))
    wall = time.perf_counter() - start
    trainer.save(checkpoint)
    final = trainer.ema.module if trainer.ema is not None else energy
    metrics: dict[str, Any] = {
        "steps": trainer.step,
        "final_loss": trainer.history.losses[-1] if trainer.history.losses else None,
        "held_out_nll": evaluate(final, trainer.step).get("held_out_nll"),
        "held_out_nll_history": trainer.history.evaluations,
        "held_out_nll_weights": (
            "the EMA weights (the history's entries are the trained weights at each evaluation)"
            if trainer.ema is not None
            else "the trained weights"
        ),
        "wall_time_s": wall,
        "throughput_samples_per_s": t["batch_size"] * (trainer.step - first_step) / wall if trainer.step > first_step else None,
        "device": str(device),
        "world_size": trainer.world_size,
        "kernel_backends": {},
        "watchdog": trainer.watchdog_report(),
    }
    metrics["negatives"] = _negatives_report(loss)
    if not main:
        return metrics
    runfiles.save_torch(
        {"energy": config["model"]["energy"], "params": config["model"]["params"], "state_dict": final.state_dict()},
        out / "model.pt",
    )
    history = trainer.history
    why_not = plotting.unavailable() if config["output"]["plots"] else None
    plots = config["output"]["plots"] and why_not is None
    metrics["plots_skipped"] = None if plots else (why_not or "[output] plots = false")
    if why_not is not None and not quiet:
        log.info("plots skipped: %s", why_not)
    if plots:
        plotting.plot_curve(out / "loss.png", history.steps, history.losses, "training loss", config["loss"]["name"])
        if lim:
            plotting.plot_density(
                out / "density.png", lambda g: final.compute_energy(g.to(train.dtype)), train.cpu(), "learned density exp(−E)"
            )
    if config["output"]["n_model_samples"] and lim:
        samples = _model_samples(config, final, train, device, quiet)
        runfiles.save_samples(out, "samples", samples)
        if plots:
            plotting.plot_landscape(
                out / "landscape.png",
                lambda pts: final.compute_energy(pts.to(train.dtype)).double(),
                samples,
                f"learned energy and {config['output']['sampler']} samples from it",
            )
    o = config["output"]
    if is_images:
        from ebm_losses.image_report import image_report

        metrics.update(
            image_report(
                final,
                loss,
                train,
                test,
                pixel_range,
                out,
                plots=plots,
                n_steps=o["image_sample_steps"],
                ais_chains=o["ais_chains"],
                ais_temperatures=o["ais_temperatures"],
                seed=t["seed"],
                labels=_digit_labels(config["data"]),
                sampler=o["sampler"],
                sampler_params=o["sampler_params"],
                denoise=o["denoise"],
                n_samples=o["image_samples"],
            )
        )
    elif o["ais_chains"] and train.dim() == 2:
        from ebm_losses.image_report import ais_log_likelihood

        metrics["ais"] = ais_log_likelihood(
            final, train, test, n_chains=o["ais_chains"], n_temperatures=o["ais_temperatures"], seed=t["seed"]
        )
    if trainer.labels is not None:  # p(y|x) (jem): accuracy, calibration, class-conditional samples
        from ebm_losses.jem_report import jem_report

        held_out = _digit_labels(config["data"], held_out=True).to(device)
        sampling = (o["class_samples"], o["class_sample_steps"], t["seed"])
        metrics["jem"] = jem_report(final, loss, train, trainer.labels, test, held_out, out, pixel_range, plots, *sampling)
    if metrics["held_out_nll"] is not None or metrics.get("ais"):
        metrics.update(held_out_report(final, train, test, lim, is_images, metrics, grid, t["seed"], o["smc_particles"]))
    runfiles.write_json(out / "metrics.json", metrics)
    return metrics


def _image_data(
    spec: dict[str, Any], grid: dict[str, Any] | None = None
) -> tuple[torch.Tensor, torch.Tensor, tuple[float, float]]:
    """``(train, test, pixel_range)``: the images of ``[data] dataset`` mapped onto ``[−1, 1]`` from ``[data] pixel_range``
    (default: the loader's), shuffled with ``[data] seed``; the test set is ``n_test`` images, at most a fifth.

    With ``[data] dequantize`` the ``K`` levels of the pixels are the centres of ``K`` bins of width ``δ = 2/K`` that
    tile ``[−1, 1]`` (``pixel_range`` is widened by half a level each side), and both splits are dequantised once
    (:func:`ebm_losses.likelihood.dequantise`, the training split with ``seed + 1``, the held-out one with ``seed + 2``);
    ``grid`` then receives ``levels`` and ``step`` (``δ``)."""
    from ebm_losses.likelihood import dequantise

    data = images.load(spec["dataset"])
    pixel_range = tuple(float(v) for v in spec["pixel_range"]) or data.pixel_range
    step = 0.0
    if spec.get("dequantize"):
        levels, pixel_step = _levels(data.images, pixel_range, spec["dataset"])
        pixel_range = (pixel_range[0] - pixel_step / 2, pixel_range[1] + pixel_step / 2)
        step = 2.0 / levels
        if grid is not None:
            grid.update(levels=levels, step=step)
    x = images.to_model_range(data.images, pixel_range)
    train, test = images.split(x, max(1, min(spec["n_test"], x.shape[0] // 5)), spec["seed"])  # 2 to 4 images: 1 held out
    train = train[: spec["n_train"]]
    if step:
        train = dequantise(train, step, torch.Generator().manual_seed(spec["seed"] + 1))
        test = dequantise(test, step, torch.Generator().manual_seed(spec["seed"] + 2))
    return train, test, pixel_range


def _levels(values: torch.Tensor, pixel_range: tuple[float, float], name: str) -> tuple[int, float]:
    """``(K, step)``: the number of levels of pixels on a grid of ``step`` over ``pixel_range``, or a ConfigError."""
    from ebm_losses.likelihood import quantum

    step = quantum(values)
    low, high = pixel_range
    if step is not None:
        k = (values.double() - low) / step
        levels = round((high - low) / step) + 1
        if float((k - k.round()).abs().max()) < 1e-3 and float(k.min()) > -1e-3 and float(k.max()) < levels - 1 + 1e-3:
            return levels, step
    raise ConfigError(
        f"[data] dequantize = true: the pixels of {name!r} are not on a grid of levels over pixel_range {list(pixel_range)} "
        "(8-bit images: 256 levels, 0..255); set [data] dequantize = false for continuous data, or fix [data] pixel_range."
    )


def _digit_labels(spec: dict[str, Any], held_out: bool = False) -> torch.Tensor | None:
    """The digits' training labels (``held_out``: the test split's), split like :func:`_image_data`'s images, else None."""
    if spec["dataset"] != images.DIGITS:
        return None
    data = images.load_digits()
    train, test = images.split(data.labels, min(spec["n_test"], data.labels.shape[0] // 5), spec["seed"])
    return test if held_out else train[: spec["n_train"]]


def _negatives_report(loss: Any) -> dict[str, Any] | None:
    """How a contrastive loss drew its negatives, flagged when its chains do not target the model's density ``exp(−E)``."""
    if callable(getattr(loss, "negatives_report", None)):
        return loss.negatives_report()
    spec = getattr(loss, "sampler_spec", None)
    if not isinstance(spec, str):
        return None
    options = dict(getattr(loss, "sampler_options", {}))
    why = []
    if options.get("noise_scale") is not None:
        why.append(
            f"noise_scale {options['noise_scale']} set apart from the step: the chains target exp(−E/T), "
            "T = noise_scale²/(2·step_size)"
        )
    elif options.get("temperature", 1.0) != 1.0:
        why.append(f"temperature {options['temperature']}: the chains target exp(−E/T)")
    if spec == "langevin":
        why.append("unadjusted Langevin is biased by its step size")
    why.append(f"short runs of {loss.n_steps} steps from the buffer or the data do not reach equilibrium")
    return {
        "sampler": spec,
        "options": options,
        "n_steps": loss.n_steps,
        "samples_model_density": False,
        "why_not": "; ".join(why),
    }


def _model_samples(
    config: dict[str, Any], energy: ebmcore.EnergyModel, train: torch.Tensor, device: torch.device, quiet: bool
) -> torch.Tensor:
    """``[output] n_model_samples`` draws from the trained energy with ``[output] sampler``, started at data points,
    after 200 warm-up steps where the sampler can be warmed up, then 200 steps."""
    from ebm_samplers.adaptation import cannot_warm_up, warmup

    o = config["output"]
    try:
        sampler = registry.get("sampler", o["sampler"])(energy, **o["sampler_params"])
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{config['source']} [output] sampler_params: {exc}") from None
    g = torch.Generator(device=device).manual_seed(config["train"]["seed"])
    x0 = train[torch.randint(0, train.shape[0], (o["n_model_samples"],), generator=g, device=device)]
    tunables: dict[str, Any] = {}
    why_not = cannot_warm_up(sampler)
    if why_not is None:
        tuned = warmup(sampler, x0, 200, target_accept=0.6, generator=g)
        x0, tunables = tuned.x, tuned.tunables
    elif not quiet:
        log.info("model samples without warm-up: %s", why_not)
    return sampler.sample(x0, 200, generator=g, **tunables)


def add_command(subparsers: Any) -> None:
    p = subparsers.add_parser("train", help=COMMANDS["train"])
    ARGUMENTS["train"](p)  # declared without torch, for `ebm train --help` (ebmcore.commands)
    p.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    config = load_config(
        args.config,
        {
            "train": {
                "device": args.device,
                "backend": args.backend,
                "seed": args.seed,
                "steps": args.steps,
                "threads": args.threads,
            }
        },
    )
    out = Path(args.out or config["output"]["dir"])
    metrics = run(config, out, resume=args.resume, overwrite=args.overwrite, quiet=args.quiet)
    if int(os.environ.get("RANK", "0")) == 0:
        print(summary(metrics, out))
    return 0
