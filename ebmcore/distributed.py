"""torch.distributed (``torchrun``) for sampling and training: chains or batches sharded across
processes, one reproducible RNG stream per rank, results gathered, diagnostics over all chains.
Every plugin's jobs use these helpers (``ebm sample`` and ``ebm train`` under ``torchrun``).

Under ``torchrun --nproc-per-node N`` every process calls :func:`init`, which joins the process group
(NCCL when CUDA is available, gloo otherwise; ``EBM_DIST_BACKEND`` or ``backend=`` overrides) with a
bounded timeout, so a rank that dies makes the others fail with an error instead of hanging. Without
``torchrun`` (``WORLD_SIZE`` unset or 1) everything degrades to one process.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from ebmcore.errors import InputError
from ebmcore.recording import finite_summary

__all__ = [
    "DistributedRun",
    "init",
    "shutdown",
    "shard",
    "rank_generator",
    "gather_chains",
    "all_mean",
    "sample",
    "DistributedSamples",
]


@dataclass(frozen=True)
class DistributedRun:
    """Where this process stands: ``rank`` of ``world_size``, its ``device`` and the ``backend``."""

    rank: int
    world_size: int
    device: torch.device
    backend: str

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world_size > 1


def init(backend: str = "auto", timeout_s: float = 120.0, device: str | None = None) -> DistributedRun:
    """Join the process group ``torchrun`` set up (idempotent); one process if there is none."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    backend = os.environ.get("EBM_DIST_BACKEND", backend)
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend not in ("gloo", "nccl"):
        raise InputError(f"distributed backend must be 'gloo', 'nccl' or 'auto', got {backend!r}.")
    if device is None:
        device = f"cuda:{local_rank}" if backend == "nccl" else "cpu"
    dev = torch.device(device)
    if world <= 1:
        return DistributedRun(0, 1, dev, backend)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    return DistributedRun(dist.get_rank(), dist.get_world_size(), dev, backend)


def shutdown(run: DistributedRun) -> None:
    """Wait for every rank, then leave the process group (call it at the end of a run)."""
    if run.active and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def shard(n: int, rank: int, world_size: int) -> slice:
    """The rows of ``n`` chains this rank owns: contiguous, sizes differing by at most one."""
    base, extra = divmod(n, world_size)
    start = rank * base + min(rank, extra)
    return slice(start, start + base + (1 if rank < extra else 0))


def rank_generator(seed: int, rank: int, device: torch.device) -> torch.Generator:
    """A generator whose stream is a function of (``seed``, ``rank``) only: reproducible for a given
    seed and world size, and different on every rank."""
    mixed = (seed * 0x9E3779B97F4A7C15 + (rank + 1) * 0xBF58476D1CE4E5B9) % (2**63 - 1)
    return torch.Generator(device=device).manual_seed(mixed)


def gather_chains(local: Tensor, run: DistributedRun, dim: int = 0) -> Tensor:
    """Concatenate every rank's ``local`` along the chain dimension ``dim``, in rank order, on every rank."""
    if not run.active:
        return local
    sizes = [torch.zeros(1, dtype=torch.int64, device=local.device) for _ in range(run.world_size)]
    dist.all_gather(sizes, torch.tensor([local.shape[dim]], device=local.device))
    largest = int(max(s.item() for s in sizes))
    pad = list(local.shape)
    pad[dim] = largest - local.shape[dim]
    padded = torch.cat([local, local.new_zeros(pad)], dim) if pad[dim] else local.contiguous()
    parts = [torch.empty_like(padded) for _ in range(run.world_size)]
    dist.all_gather(parts, padded)
    return torch.cat([p.narrow(dim, 0, int(s.item())) for p, s in zip(parts, sizes)], dim)


def all_mean(local_sum: Tensor, local_count: int | Tensor, run: DistributedRun) -> Tensor:
    """``Σ local_sum / Σ local_count`` over ranks (float64)."""
    total = local_sum.double().clone()
    count = torch.as_tensor(local_count, dtype=torch.float64, device=total.device).clone()
    if run.active:
        dist.all_reduce(total)
        dist.all_reduce(count)
    return total / count


@dataclass(frozen=True)
class DistributedSamples:
    """All chains (gathered, in rank order) and diagnostics over all of those that stayed finite; the same on every rank.

    ``samples: (n_chains, *event)``, ``trajectory: (n_kept, n_chains, *event)``; ``summary`` holds
    mean, sd, ess_bulk, ess_tail, r_hat (:func:`ebmcore.recording.finite_summary` of the gathered trajectory: its finite chains);
    ``acceptance`` and ``divergences`` are reduced across ranks; ``stats`` (with ``return_stats``) are the per-draw
    statistics of :class:`ebmcore.recording.SampleResult`, ``(n_kept, n_chains)`` each, gathered."""

    samples: Tensor
    trajectory: Tensor | None
    summary: dict[str, Tensor]
    acceptance: float | None
    divergences: int | None
    local: slice
    stats: dict[str, Tensor] | None = None


def _gather_stat(value: Tensor, run: DistributedRun) -> Tensor:
    """:func:`gather_chains` of a ``(n_kept, n_local)`` statistic (bool ones as bytes, which every backend sends)."""
    if value.dtype != torch.bool:
        return gather_chains(value, run, dim=1)
    return gather_chains(value.to(torch.uint8), run, dim=1).bool()


def sample(
    sampler: Any,
    n_chains: int,
    n_steps: int,
    run: DistributedRun,
    *,
    seed: int = 0,
    init_scale: float = 1.0,
    burn_in: int = 0,
    thin: int = 1,
    x0: Tensor | None = None,
    local_x0: Tensor | None = None,
    generator: torch.Generator | None = None,
    return_trajectory: bool = True,
    return_stats: bool = False,
    progress: bool = False,
    **tunables: Any,
) -> DistributedSamples:
    """Sample ``n_chains`` chains with any sampler (:meth:`ebmcore.Sampler.sample`), sharded over the ranks (each
    rank runs its shard with its own stream).

    Initial states: ``local_x0`` (this rank's shard, e.g. after a warm-up), else rows of a global
    ``x0``, else ``N(0, init_scale²I)`` from the rank's stream (``generator`` or one from ``seed``).
    ``return_trajectory=False`` gathers only the final states (no trajectory, no ESS/R-hat): for large
    runs whose kept trajectory would not fit in memory on one rank."""
    part = shard(n_chains, run.rank, run.world_size)
    g = generator if generator is not None else rank_generator(seed, run.rank, run.device)
    event = sampler.energy.event_shape or (2,)
    if local_x0 is not None:
        local_x0 = local_x0.to(run.device)
    elif x0 is None:
        local_x0 = init_scale * torch.randn((part.stop - part.start, *event), generator=g, device=run.device)
    else:
        local_x0 = x0[part].to(run.device)
    result = sampler.sample(
        local_x0,
        n_steps,
        burn_in=burn_in,
        thin=thin,
        return_trajectory=return_trajectory,
        return_diagnostics=True,
        return_stats=return_stats,
        generator=g,
        progress=progress,
        **tunables,
    )
    trajectory = gather_chains(result.trajectory, run, dim=1) if return_trajectory else None
    stats = {name: _gather_stat(value, run) for name, value in result.stats.items()} if return_stats else None
    samples = gather_chains(result.samples, run, dim=0)
    d = result.diagnostics
    acceptance = divergences = None
    if d is not None and d.acceptance_rate is not None:
        acceptance = float(all_mean(d.acceptance_rate.sum(), d.acceptance_rate.numel(), run))
        div = d.divergences.sum().to(torch.int64)
        if run.active:
            dist.all_reduce(div)
        divergences = int(div)
    summary = finite_summary(trajectory) if trajectory is not None else {}
    return DistributedSamples(samples, trajectory, summary, acceptance, divergences, part, stats)
