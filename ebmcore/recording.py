"""What a sampling run records besides its final states: the kept trajectory, per-step diagnostics and
per-draw sampler statistics.

:class:`Recorder` preallocates the trajectory and diagnostics before the loop (the statistics at the first
kept draw, once their fields are known), makes no host sync inside it, and reads only what every sampler has
(``state.x``) plus, when its ``info`` carries them, the acceptance, divergence, tree depth, leapfrog steps
and Hamiltonian of each transition.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

import torch
from torch import Tensor

from ebmcore import diagnostics
from ebmcore.errors import InputError

__all__ = [
    "Diagnostics",
    "SampleResult",
    "NonFiniteChainsWarning",
    "Recorder",
    "INFO_STATS",
    "nonfinite_chains",
    "finite_summary",
    "available_memory",
    "check_trajectory_fits",
]

INFO_STATS = ("acceptance_prob", "divergent", "tree_depth", "n_leapfrog_steps", "hamiltonian")
"""The ``info`` fields recorded per draw and chain when a sampler reports them as ``(n_chains,)`` tensors."""


class NonFiniteChainsWarning(RuntimeWarning):
    """Some chains ended non-finite (ULA at too large a step size); they are reported, never clamped."""


def nonfinite_chains(x: Tensor, dim: int = 0) -> Tensor:
    """Indices of the chains (along ``dim``: 0 for states ``(n_chains, *event)``, 1 for a trajectory
    ``(n_kept, n_chains, *event)``) holding any NaN or infinite value."""
    return (~torch.isfinite(x.movedim(dim, 0).flatten(1)).all(1)).nonzero().flatten()


def finite_summary(trajectory: Tensor) -> dict[str, Tensor]:
    """``ebmcore.diagnostics.summary`` of the chains of ``trajectory: (n_kept, n_chains, *event)`` that stayed finite
    (``{}`` with fewer than 4 kept draws or no finite chain): diverged chains are counted by the caller, not diagnosed."""
    if trajectory.shape[0] < 4:
        return {}
    bad = nonfinite_chains(trajectory, dim=1)
    if bad.numel() == trajectory.shape[1]:
        return {}
    if bad.numel():
        keep = torch.ones(trajectory.shape[1], dtype=torch.bool, device=trajectory.device)
        keep[bad] = False
        trajectory = trajectory[:, keep]
    return diagnostics.summary(trajectory)


@dataclass(frozen=True)
class Diagnostics:
    """Per-kept-step summaries over chains, and per-chain totals over the steps after burn-in.

    ``mean``, ``variance``: ``(n_kept, *event_shape)``; ``energy``: ``(n_kept,)`` mean energy;
    ``acceptance``: ``(n_kept,)`` fraction of chains that accepted at that step;
    ``acceptance_rate``: ``(n_chains,)``; ``divergences``: ``(n_chains,)`` counts of non-finite or
    diverging proposals; ``nonfinite_chains``: indices of chains non-finite at the end.
    Samplers without accept/reject (ULA) have ``None`` for the acceptance fields and divergences.
    """

    mean: Tensor
    variance: Tensor
    energy: Tensor
    acceptance: Tensor | None
    acceptance_rate: Tensor | None
    divergences: Tensor | None
    nonfinite_chains: Tensor
    wall_time: float


class SampleResult(NamedTuple):
    """What ``sample`` returns when a trajectory, diagnostics or statistics are asked for.

    ``stats`` (with ``return_stats``): per-draw statistics ``(n_kept, n_chains)`` of the transition that made each
    kept draw: ``energy`` (``E(x)`` of the draw), ``acceptance`` (the info's ``acceptance_prob``, else its
    ``accepted``), ``divergent`` (bool), and ``tree_depth``, ``n_leapfrog_steps``, ``hamiltonian`` where the info
    has them. A fused chain's info sums over the transitions since the previous kept draw: their means are kept
    (``divergent``: whether any diverged).
    """

    samples: Tensor
    trajectory: Tensor | None
    diagnostics: Diagnostics | None
    stats: dict[str, Tensor] | None = None


def available_memory(device: torch.device) -> int | None:
    """Bytes a new tensor on ``device`` can take now: free GPU memory (and what torch's allocator holds unused) on
    CUDA; the kernel's ``MemAvailable`` (else the physical memory) on the CPU; None where unknown (meta, MPS)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    if device.type != "cpu":
        return None
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _size(n_bytes: int) -> str:
    """``n_bytes`` in decimal units: ``40.0 TB``."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n_bytes >= scale:
            return f"{n_bytes / scale:.1f} {unit}"
    return f"{n_bytes} B"


def check_trajectory_fits(x: Tensor, n_kept: int) -> None:
    """Refuse, before any step, a kept trajectory ``(n_kept, *x.shape)`` larger than the memory ``x``'s device has
    free, with the size it needs and how to stream instead."""
    needed = n_kept * x.numel() * x.element_size()
    available = available_memory(x.device)
    if available is None or needed <= available:
        return
    raise InputError(
        f"return_trajectory=True would keep a {(n_kept, *x.shape)} trajectory: {_size(needed)} on {x.device}, "
        f"which has {_size(available)} available. Keep fewer draws (thin=..., fewer n_steps or chains), or stream: "
        "sample in segments written to disk (ebmcore.chunks.sample_in_segments, `ebm sample` with [run] "
        "checkpoint_every = K), or draw independent chunks of chains (ebmcore.chunks.stream_chunks, `ebm sample` "
        "with [run] n_samples and chunk_size), or pass a callback that reduces each state as it comes."
    )


class Recorder:
    """The kept states ``(n_kept, *x.shape)`` (with ``trajectory``), the diagnostics (with ``diagnostics``) and
    the per-draw statistics of :class:`SampleResult` (with ``stats``) for a run from states like ``x``.
    Acceptance and divergences are counted when the sampler's ``info`` carries ``accepted`` and ``divergent``."""

    def __init__(
        self,
        x: Tensor,
        n_kept: int,
        *,
        trajectory: bool,
        diagnostics: bool,
        energy_of: Callable[[Any], Tensor],
        stats: bool = False,
    ) -> None:
        stat = torch.promote_types(x.dtype, torch.float32)
        self.trajectory = x.new_empty((n_kept, *x.shape)) if trajectory else None
        self.diagnostics, self.energy_of, self.counted = diagnostics, energy_of, False
        self.n_kept, self.stat_dtype = n_kept, stat
        self.stats: dict[str, Tensor] | None = {} if stats else None
        if diagnostics:
            self.mean = torch.empty((n_kept, *x.shape[1:]), dtype=stat, device=x.device)
            self.variance = torch.empty_like(self.mean)
            self.energy = torch.empty(n_kept, dtype=stat, device=x.device)
            self.acceptance = torch.empty(n_kept, dtype=stat, device=x.device)
            self.accepted = torch.zeros(x.shape[0], dtype=stat, device=x.device)
            self.divergences = torch.zeros(x.shape[0], dtype=torch.int64, device=x.device)

    def count(self, info: Any) -> None:
        """Add a transition's (or a fused chunk's) accepted and divergent counts per chain, if it reports them."""
        accepted = getattr(info, "accepted", None) if self.diagnostics else None
        if accepted is not None:
            self.accepted += accepted
            divergent = getattr(info, "divergent", None)
            if divergent is not None:
                self.divergences += divergent
            self.counted = True

    @torch.no_grad()
    def keep(self, k: int, state: Any, info: Any, size: int) -> None:
        """Record kept state ``k``: the states, their mean, variance and mean energy, and (for ``info`` of
        ``size`` transitions) the fraction accepted."""
        if self.trajectory is not None:
            self.trajectory[k].copy_(state.x)
        energy = self.energy_of(state) if self.diagnostics or self.stats is not None else None
        if self.stats is not None:
            self._keep_stats(k, energy, info, size)
        if not self.diagnostics:
            return
        x = state.x.to(self.mean.dtype)
        var, mean = torch.var_mean(x, dim=0, correction=1 if x.shape[0] > 1 else 0)
        self.mean[k] = mean
        self.variance[k] = var
        self.energy[k] = energy.to(self.energy.dtype).mean()
        accepted = getattr(info, "accepted", None)
        if accepted is not None:
            accepted = torch.as_tensor(accepted, dtype=self.acceptance.dtype)
            self.acceptance[k] = (accepted if size == 1 else accepted / size).mean()

    def _keep_stats(self, k: int, energy: Tensor, info: Any, size: int) -> None:
        """Row ``k`` of every statistic; a statistic's ``(n_kept, n_chains)`` buffer is made the first time it is seen.
        The ``info`` of a fused call of ``size`` > 1 transitions holds sums over them: their means are recorded (and
        ``divergent``: whether any diverged)."""
        n = energy.shape[0]
        values: dict[str, Any] = {}
        for name in ("accepted", *INFO_STATS):
            value = getattr(info, name, None)
            if isinstance(value, Tensor) and value.shape == (n,):
                values[name] = value if size == 1 or name == "divergent" else value.to(self.stat_dtype) / size
        accepted = values.pop("accepted", None)
        if "acceptance_prob" in values or accepted is not None:
            values["acceptance"] = values.pop("acceptance_prob", accepted).to(self.stat_dtype)  # bool when accepted
        if "divergent" in values:
            values["divergent"] = values["divergent"] > 0
        values["energy"] = energy
        for name, value in values.items():
            buffer = self.stats.get(name)
            if buffer is None:
                dtype = self.stat_dtype if value.is_floating_point() else value.dtype
                buffer = self.stats[name] = torch.zeros((self.n_kept, n), dtype=dtype, device=value.device)
            buffer[k].copy_(value)

    def finish(self, nonfinite: Tensor, n_steps: int, wall: float) -> Diagnostics | None:
        """The diagnostics of a run of ``n_steps`` kept-phase transitions (None if not recorded)."""
        if not self.diagnostics:
            return None
        if not self.counted:  # no accept/reject (ULA)
            return Diagnostics(self.mean, self.variance, self.energy, None, None, None, nonfinite, wall)
        return Diagnostics(
            self.mean,
            self.variance,
            self.energy,
            self.acceptance,
            self.accepted / max(n_steps, 1),
            self.divergences,
            nonfinite,
            wall,
        )
