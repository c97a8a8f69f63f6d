"""Plots of runs and trainings (PNG, matplotlib's Agg backend), shared by every plugin's jobs.

matplotlib is optional (``pip install 'ebmcore[plot]'``): :func:`unavailable` says why plots cannot
be drawn here, and the jobs then skip them with one line instead of failing.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "unavailable",
    "pyplot",
    "save_figure",
    "plot_landscape",
    "plot_traces",
    "plot_autocorrelation",
    "plot_curve",
    "plot_density",
]


def unavailable() -> str | None:
    """Why plots cannot be drawn here (matplotlib missing), or None."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return "matplotlib is not installed (pip install 'ebmcore[plot]')"
    return None


def pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: Path) -> None:
    """Write ``fig`` as a PNG to ``path`` atomically (:func:`ebmcore.runfiles.write_bytes`), and close it."""
    from ebmcore.runfiles import write_bytes

    buffer = io.BytesIO()
    try:
        fig.savefig(buffer, dpi=110, format="png")
    finally:
        pyplot().close(fig)
    write_bytes(path, buffer.getbuffer())


def _grid(lim: tuple[float, float, float, float], n: int = 200) -> tuple[Tensor, Tensor, Tensor]:
    xs = torch.linspace(lim[0], lim[1], n, dtype=torch.float64)
    ys = torch.linspace(lim[2], lim[3], n, dtype=torch.float64)
    xx, yy = torch.meshgrid(xs, ys, indexing="xy")
    return xx, yy, torch.stack([xx.flatten(), yy.flatten()], 1)


def _limits(points: Tensor, pad: float = 0.15) -> tuple[float, float, float, float]:
    lo, hi = points.quantile(0.005, 0).tolist(), points.quantile(0.995, 0).tolist()
    w = [hi[0] - lo[0], hi[1] - lo[1]]
    return lo[0] - pad * w[0] - 0.5, hi[0] + pad * w[0] + 0.5, lo[1] - pad * w[1] - 0.5, hi[1] + pad * w[1] + 0.5


def plot_landscape(path: Path, energy_fn: Callable[[Tensor], Tensor], samples: Tensor, title: str) -> None:
    """Energy contours of a 2-d energy with the samples over them."""
    plt = pyplot()
    pts = samples.detach().double().cpu()
    lim = _limits(pts)
    xx, yy, grid = _grid(lim)
    with torch.no_grad():
        e = energy_fn(grid).reshape(xx.shape).cpu()
    e = e - e.min()
    fig, ax = plt.subplots(figsize=(6, 5))
    cs = ax.contourf(xx.numpy(), yy.numpy(), e.clamp(max=float(e.quantile(0.9))).numpy(), levels=30, cmap="viridis")
    fig.colorbar(cs, ax=ax, label="E(x) − min E")
    shown = pts[torch.randperm(pts.shape[0], generator=torch.Generator().manual_seed(0))[:3000]]
    ax.scatter(shown[:, 0].numpy(), shown[:, 1].numpy(), s=2, c="white", alpha=0.5, linewidths=0)
    ax.set(title=title, xlabel="x₁", ylabel="x₂", xlim=lim[:2], ylim=lim[2:])
    fig.tight_layout()
    save_figure(fig, path)


def plot_traces(path: Path, trajectory: Tensor, n_chains: int = 4, n_coords: int = 2) -> None:
    """Trace plots of the first chains, one panel per coordinate; ``trajectory: (n_kept, n_chains, d)``."""
    plt = pyplot()
    traj = trajectory.detach().float().cpu().flatten(2)
    k = min(n_coords, traj.shape[2])
    fig, axes = plt.subplots(k, 1, figsize=(8, 2.2 * k), squeeze=False)
    for i in range(k):
        for c in range(min(n_chains, traj.shape[1])):
            axes[i, 0].plot(traj[:, c, i].numpy(), lw=0.7)
        axes[i, 0].set_ylabel(f"x{i + 1}")
    axes[-1, 0].set_xlabel("kept step")
    fig.suptitle("traces (first chains)")
    fig.tight_layout()
    save_figure(fig, path)


def plot_autocorrelation(path: Path, autocorrelation: Tensor, n_coords: int = 2) -> None:
    """Mean autocorrelation over chains by lag; ``autocorrelation: (n_lags, n_chains, d)``."""
    plt = pyplot()
    acf = autocorrelation.detach().float().cpu().flatten(2).mean(1)
    fig, ax = plt.subplots(figsize=(7, 3.5))
    for i in range(min(n_coords, acf.shape[1])):
        ax.plot(acf[:, i].numpy(), label=f"x{i + 1}")
    ax.axhline(0, color="grey", lw=0.5)
    ax.set(xlabel="lag", ylabel="autocorrelation", title="autocorrelation (mean over chains)")
    ax.legend()
    fig.tight_layout()
    save_figure(fig, path)


def plot_curve(path: Path, steps: list[int], values: list[float], title: str, ylabel: str) -> None:
    """A training curve with a moving average."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.plot(steps, values, lw=0.5, alpha=0.5, label="per step")
    if len(values) >= 20:
        w = max(len(values) // 50, 5)
        smooth = np.convolve(values, np.ones(w) / w, mode="valid")
        ax.plot(steps[w - 1 :], smooth, lw=1.5, label=f"moving average ({w})")
    ax.set(xlabel="step", ylabel=ylabel, title=title)
    ax.legend()
    fig.tight_layout()
    save_figure(fig, path)


def plot_density(path: Path, energy_fn: Callable[[Tensor], Tensor], data: Tensor, title: str) -> None:
    """The data (2-d histogram) next to the learned density ``exp(−E)`` normalised on the same grid."""
    plt = pyplot()
    pts = data.detach().double().cpu()
    lim = _limits(pts)
    xx, yy, grid = _grid(lim)
    with torch.no_grad():
        log_p = -energy_fn(grid).double().cpu()
    density = torch.softmax(log_p, 0).reshape(xx.shape)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.5))
    axes[0].hist2d(pts[:, 0].numpy(), pts[:, 1].numpy(), bins=100, range=[lim[:2], lim[2:]], cmap="magma")
    axes[0].set(title="data", xlabel="x₁", ylabel="x₂")
    axes[1].imshow(density.numpy(), origin="lower", extent=lim, cmap="magma", aspect="auto")
    axes[1].set(title=title, xlabel="x₁")
    fig.tight_layout()
    save_figure(fig, path)
