"""Runs too long or too large for one ``sample`` call: checkpointed segments and streamed chunks.

:func:`sample_in_segments` runs one chain set in segments of kept draws, checkpointing the chains
and the generator after each, so that an interrupted run resumes exactly (the draws are those of
one uninterrupted run, per-step or fused). :func:`stream_chunks` draws many independent chunks of chains,
each seeded by ``(seed, chunk)``, and hands each chunk's samples to a writer, so memory stays
bounded by one chunk and any chunk can be redrawn alone.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any, Callable

import torch
from torch import Tensor

from ebmcore.sampler import NoiseStream, Sampler
from ebmcore.errors import InputError
from ebmcore.recording import Diagnostics, SampleResult, nonfinite_chains
from ebmcore.runfiles import load_arrays, load_torch, make_dir, save_samples, save_torch

log = logging.getLogger(__name__)

__all__ = ["sample_in_segments", "load_checkpoint", "stream_chunks", "chunk_generator"]

_RESTART = "start the run again with --overwrite (or choose another --out)"


def load_checkpoint(directory: Path, device: torch.device) -> dict[str, Any] | None:
    """The checkpoint :func:`sample_in_segments` left in ``directory`` (None if there is none): ``x``, ``tunables``,
    ``generator`` (its state), and how far the run got."""
    path = directory / "checkpoint.pt"
    return load_torch(path, map_location=device, what="a sampling checkpoint", fix=_RESTART) if path.exists() else None


def sample_in_segments(
    sampler: Sampler,
    x: Tensor,
    n_steps: int,
    every: int,
    directory: Path,
    *,
    burn_in: int = 0,
    thin: int = 1,
    generator: torch.Generator,
    saved: dict[str, Any] | None = None,
    progress: bool = False,
    on_segment: Callable[[int], None] = lambda index: None,
    metadata: dict[str, Any] | None = None,
    **tunables: Any,
) -> SampleResult:
    """``sampler.sample`` with a trajectory, diagnostics and per-draw statistics, in segments of ``every`` kept draws.

    After each segment its records go to ``directory/segments/segment-NNNNN.pt`` and the chains, the
    generator's state, ``tunables`` and ``metadata`` (plain values) to ``directory/checkpoint.pt``; then
    ``on_segment(index)`` runs.
    With ``saved`` (:func:`load_checkpoint`) the run continues where it stopped: ``x``, ``tunables`` and the
    generator's state come from it, and the burn-in is behind it.
    """
    total = n_steps // thin
    if total < 1:
        raise InputError(f"checkpointed runs keep draws in segments: n_steps ({n_steps}) must be at least thin ({thin}).")
    first = sampler.init(x[:1])
    state_fields = set(getattr(first, "_fields", None) or vars(first))
    if not state_fields <= {"x", "energy", "grad"}:
        raise InputError(
            f"{type(sampler).__name__} keeps more than its positions in its state ({', '.join(sorted(state_fields))}), "
            "which a restart from the positions would lose: run it without checkpoint_every."
        )
    parts_dir = directory / "segments"
    make_dir(parts_dir)
    done = index = 0
    stream = NoiseStream()  # one fused noise stream across the segments, as in one call
    if saved is not None:
        x, done, index, tunables, burn_in = saved["x"], saved["kept"], saved["segments"], saved["tunables"], 0
        metadata, (stream.seed, stream.offset) = saved["metadata"], saved["stream"]
        generator.set_state(saved["generator"].cpu())  # a generator's state is a CPU tensor, whatever its device
    while done < total:
        k = min(every, total - done)
        steps = k * thin if done + k < total else n_steps - done * thin  # the last segment takes the remainder
        result = sampler.sample(
            x,
            steps,
            burn_in=burn_in,
            thin=thin,
            return_trajectory=True,
            return_diagnostics=True,
            return_stats=True,
            generator=generator,
            progress=progress,
            stream=stream,
            **tunables,
        )
        d = result.diagnostics
        save_torch(
            {
                "trajectory": result.trajectory,
                "mean": d.mean,
                "variance": d.variance,
                "energy": d.energy,
                "acceptance": d.acceptance,
                "accepted": None if d.acceptance_rate is None else d.acceptance_rate * steps,
                "divergences": d.divergences,
                "wall_time": d.wall_time,
                "steps": steps,
                "stats": result.stats,
            },
            parts_dir / f"segment-{index:05d}.pt",
        )
        x, done, index, burn_in = result.samples, done + k, index + 1, 0
        save_torch(
            {
                "x": x,
                "kept": done,
                "segments": index,
                "generator": generator.get_state(),
                "tunables": tunables,
                "metadata": metadata or {},
                "stream": (stream.seed, stream.offset),
            },
            directory / "checkpoint.pt",
        )
        on_segment(index)
    parts = [
        load_torch(parts_dir / f"segment-{i:05d}.pt", what=f"segment {i} of the checkpointed run", fix=_RESTART)
        for i in range(index)
    ]
    cat = lambda key: None if parts[0][key] is None else torch.cat([p[key] for p in parts])  # noqa: E731
    steps = sum(p["steps"] for p in parts)
    accepted = None if parts[0]["accepted"] is None else sum(p["accepted"] for p in parts) / max(steps, 1)
    divergences = None if parts[0]["divergences"] is None else sum(p["divergences"] for p in parts)
    nonfinite = nonfinite_chains(x)
    diagnostics = Diagnostics(
        cat("mean"),
        cat("variance"),
        cat("energy"),
        cat("acceptance"),
        accepted,
        divergences,
        nonfinite,
        sum(p["wall_time"] for p in parts),
    )
    stats = (
        None
        if any(p.get("stats") is None for p in parts)
        else {  # segments written before statistics were: none
            name: torch.cat([p["stats"][name] for p in parts]) for name in parts[0]["stats"]
        }
    )
    return SampleResult(x, cat("trajectory"), diagnostics, stats)


def chunk_generator(seed: int, chunk: int, device: torch.device) -> torch.Generator:
    """The generator of chunk ``chunk`` of a streamed run with ``seed``: a function of the two only."""
    return torch.Generator(device=device).manual_seed((seed * 1_000_003 + chunk + 1) % 2**64)


def _duration(seconds: float) -> str:
    """``seconds`` as ``"42 s"``, ``"17 min"`` or ``"2.1 h"``."""
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def stream_chunks(
    sampler: Sampler,
    n_samples: int,
    chunk_size: int,
    n_steps: int,
    directory: Path,
    *,
    initial: Callable[[int, torch.Generator], Tensor],
    seed: int,
    device: torch.device,
    burn_in: int = 0,
    resume: bool = False,
    progress: bool = False,
    report_every: float | None = None,
    **tunables: Any,
) -> dict[str, Any]:
    """Draw ``n_samples`` samples as independent chunks of at most ``chunk_size`` chains into ``directory``.

    Chunk ``k`` starts at ``initial(size, generator)`` with :func:`chunk_generator` ``(seed, k)``, runs ``burn_in +
    n_steps`` steps and is written as ``chunk-NNNNN.npz`` (key ``samples``); with ``resume`` the chunks already
    written are not drawn again. Returns counts, the sampling time, the mean acceptance (None without
    accept/reject), and the chains that ended non-finite: ``nonfinite_chains`` (how many) and
    ``nonfinite_chain_indices`` (their indices in the whole stream, chunk ``k`` holding ``k·chunk_size ...``).

    ``progress`` shows a bar (a terminal); ``report_every`` (seconds) logs instead, at INFO, a line after the chunk
    that ends such an interval: chunks done, the rate in chain-steps per second and the time left at that rate
    (for logs: a job whose stderr is not a terminal is not silent)."""
    make_dir(directory)
    n_chunks = math.ceil(n_samples / chunk_size)
    written = skipped = written_samples = 0
    acceptance: list[float] = []
    nonfinite: list[int] = []
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=n_chunks, desc="chunks", unit="chunk")
    sampling = 0.0
    last_report, steps_per_chain = time.perf_counter(), burn_in + n_steps
    for k in range(n_chunks):
        size = min(chunk_size, n_samples - k * chunk_size)
        name = f"chunk-{k:05d}"
        if resume and (directory / f"{name}.npz").exists():
            saved = load_arrays(
                directory / f"{name}.npz",
                keys=("samples",),
                what="a chunk of samples",
                fix="delete it, and --resume draws that chunk again",
            )
            bad = nonfinite_chains(torch.from_numpy(saved["samples"]))  # its non-finite chains still count
            skipped += 1
        else:
            g = chunk_generator(seed, k, device)
            x0 = initial(size, g)
            start = time.perf_counter()
            # one kept state (thin = n_steps): the acceptance is counted at every step, and no per-step record
            # (n_steps × event_shape) is made or filled
            result = sampler.sample(
                x0, n_steps, burn_in=burn_in, thin=max(n_steps, 1), return_diagnostics=True, generator=g, **tunables
            )
            sampling += time.perf_counter() - start
            save_samples(directory, name, result.samples, torch_copy=False)  # a stream keeps the numpy copy only
            bad = result.diagnostics.nonfinite_chains.cpu()
            if result.diagnostics.acceptance_rate is not None:
                acceptance.append(float(result.diagnostics.acceptance_rate.mean()))
            written += 1
            written_samples += size
            del result
        nonfinite += (bad + k * chunk_size).tolist()
        if bar is not None:
            bar.update(1)
        elif report_every is not None and time.perf_counter() - last_report >= report_every and k + 1 < n_chunks:
            last_report = time.perf_counter()
            rate = written_samples * steps_per_chain / sampling if sampling else None
            left = (n_samples - min(n_samples, (k + 1) * chunk_size)) * steps_per_chain
            log.info(
                "chunk %d of %d done: %s chain-steps/s, about %s left",
                k + 1,
                n_chunks,
                "-" if rate is None else f"{rate:,.0f}",
                "?" if not rate else _duration(left / rate),
            )
    if bar is not None:
        bar.close()
    return {
        "n_samples": n_samples,
        "n_chunks": n_chunks,
        "chunks_written": written,
        "chunks_resumed": skipped,
        "sampling_time_s": sampling,
        "throughput_samples_per_s": written_samples / sampling if sampling else None,
        "acceptance": sum(acceptance) / len(acceptance) if acceptance else None,
        "nonfinite_chains": len(nonfinite),
        "nonfinite_chain_indices": nonfinite,
    }
