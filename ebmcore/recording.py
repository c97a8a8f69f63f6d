"""What a sampling run records besides its final states: the kept trajectory and per-step diagnostics.

:class:`Recorder` preallocates everything before the loop (no allocation, no host sync inside it)
and reads only what every sampler has (``state.x``) plus, when its ``info`` carries them, the
acceptance and divergence of each transition.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

import torch
from torch import Tensor

from ebmcore.errors import InputError

__all__ = ["Diagnostics", "SampleResult", "NonFiniteChainsWarning", "Recorder", "available_memory", "check_trajectory_fits"]


class NonFiniteChainsWarning(RuntimeWarning):
    """Some chains ended non-finite (ULA at too large a step size); they are reported, never clamped."""


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
    """What ``sample`` returns when a trajectory or diagnostics are asked for."""

    samples: Tensor
    trajectory: Tensor | None
    diagnostics: Diagnostics | None


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
        "with [run] n_samples and chunk_size), or pass a callback that reduces each state as it comes.")


class Recorder:
    """The kept states ``(n_kept, *x.shape)`` (with ``trajectory``) and the diagnostics (with ``diagnostics``),
    preallocated for a run from states like ``x``. Acceptance and divergences are counted when the sampler's
    ``info`` carries ``accepted`` and ``divergent``."""

    def __init__(self, x: Tensor, n_kept: int, *, trajectory: bool, diagnostics: bool,
                 energy_of: Callable[[Any], Tensor]) -> None:
        stat = torch.promote_types(x.dtype, torch.float32)
        self.trajectory = x.new_empty((n_kept, *x.shape)) if trajectory else None
        self.diagnostics, self.energy_of, self.counted = diagnostics, energy_of, False
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
        if not self.diagnostics:
            return
        x = state.x.to(self.mean.dtype)
        var, mean = torch.var_mean(x, dim=0, correction=1 if x.shape[0] > 1 else 0)
        self.mean[k] = mean
        self.variance[k] = var
        self.energy[k] = self.energy_of(state).to(self.energy.dtype).mean()
        accepted = getattr(info, "accepted", None)
        if accepted is not None:
            accepted = torch.as_tensor(accepted, dtype=self.acceptance.dtype)
            self.acceptance[k] = (accepted if size == 1 else accepted / size).mean()

    def finish(self, nonfinite: Tensor, n_steps: int, wall: float) -> Diagnostics | None:
        """The diagnostics of a run of ``n_steps`` kept-phase transitions (None if not recorded)."""
        if not self.diagnostics:
            return None
        if not self.counted:  # no accept/reject (ULA)
            return Diagnostics(self.mean, self.variance, self.energy, None, None, None, nonfinite, wall)
        return Diagnostics(self.mean, self.variance, self.energy, self.acceptance, self.accepted / max(n_steps, 1),
                           self.divergences, nonfinite, wall)
