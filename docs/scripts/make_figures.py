"""Generate the documentation's figures from real runs of the samplers and the trainer.

    .venv/bin/python docs/scripts/make_figures.py            # writes docs/assets/figures/*.png
    .venv/bin/python docs/scripts/make_figures.py --quick --out /tmp/figs   # tiny sizes, a smoke test

Every figure is drawn from what the library computes (samples, acceptance rates, autocorrelations,
losses) or, for ``benchmarks.png``, from the committed benchmark results
(``BENCHMARK_JSONS``: the latest run of each workload). All randomness comes from seeded
``torch.Generator`` objects, so a rerun on the same machine draws the same figures. The full run
takes about 4 minutes on one CPU thread, 3 of them ``toys.png`` (four training methods on two 2-d sets; it writes
the numbers it shows to ``toys.json`` beside it); ``--quick`` (used by ``tests/test_docs_site.py``) a few seconds.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path

os.environ.setdefault("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16")  # see docs/samplers.md, "Precision"

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

import ebmcore  # noqa: E402
from ebmcore import diagnostics  # noqa: E402
from ebm_losses import SlicedScoreMatching, Trainer, datasets  # noqa: E402
from ebm_samplers import (  # noqa: E402
    HMCSampler,
    LangevinSampler,
    MALASampler,
    NUTSSampler,
    ParallelTemperingSampler,
    warmup,
)

ROOT = Path(__file__).resolve().parents[2]
BENCHMARK_JSONS = [  # later runs replace earlier ones workload by workload
    ROOT / "benchmarks" / "results" / "2026-11-21-cpu-1thread-final.json",  # every workload, per-step loop
    ROOT / "benchmarks" / "results" / "2026-11-21-cpu-1thread-fused-avx512.json",  # W1-W3, S1, S4 with the fused chains
    ROOT / "benchmarks" / "results" / "2026-11-25-cpu-1thread-contrastive.json",  # W4-W8, W8K, S8: the feed-forward kernels
    ROOT / "benchmarks" / "results" / "2026-11-26-cpu-1thread-ops.json",  # W1, W3, W4, W5, S1, S4 after the ops and chain changes
    ROOT / "benchmarks" / "results" / "2026-11-26-cpu-1thread-nuts.json",  # W8: fused NUTS runs keep positions only
]
DPI = 110
COLORS = {"ULA": "#1b9e77", "MALA": "#d95f02", "HMC": "#7570b3", "NUTS": "#e7298a", "PT": "#66a61e"}


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def grid(energy: ebmcore.EnergyModel, lim: tuple[float, float, float, float], n: int):
    """E on an n×n grid over lim = (x0, x1, y0, y1): returns X, Y, E, each (n, n)."""
    xs = torch.linspace(lim[0], lim[1], n)
    ys = torch.linspace(lim[2], lim[3], n)
    X, Y = torch.meshgrid(xs, ys, indexing="xy")
    with torch.no_grad():
        E = energy.energy(torch.stack([X.reshape(-1), Y.reshape(-1)], 1)).reshape(n, n)
    return X.numpy(), Y.numpy(), E.numpy()


def contour(ax, energy: ebmcore.EnergyModel, lim: tuple[float, float, float, float], cap: float) -> None:
    """Filled contours of E over lim, low energy dark; energies above min(E) + cap share the top colour."""
    X, Y, E = grid(energy, lim, 200)
    E = E.clip(max=E.min() + cap)
    ax.contourf(X, Y, E, levels=20, cmap="viridis")
    ax.contour(X, Y, E, levels=20, colors="k", linewidths=0.3, alpha=0.3)


def save(fig, out: Path, name: str) -> Path:
    path = out / name
    fig.savefig(path, dpi=DPI, bbox_inches="tight")
    plt.close(fig)
    return path


def landscapes(out: Path, quick: bool) -> Path:
    """Three builtin 2-d energies, with samples from adapted MALA on top."""
    n_chains, n_warm, n_steps = (200, 50, 50) if quick else (2000, 300, 1000)
    cases = [  # (title, energy, plot limits, colour range: energies above min + cap share one colour)
        (
            "gaussian_mixture",
            ebmcore.energy(
                "gaussian_mixture",
                means=torch.tensor([[-2.0, -1.0], [2.0, -1.0], [0.0, 2.0]]),
                stds=torch.tensor([0.5, 0.7, 0.6]),
                weights=torch.tensor([0.3, 0.4, 0.3]),
            ),
            (-4, 4, -3.5, 4),
            10.0,
        ),
        ("double_well (barrier 2)", ebmcore.energy("double_well", dim=2, barrier=2.0), (-2, 2, -2, 2), 6.0),
        ("rosenbrock (a=1, b=5)", ebmcore.energy("rosenbrock", dim=2, a=1.0, b=5.0), (-2.5, 3, -1.5, 6), 12.0),
    ]
    fig, axes = plt.subplots(1, 3, figsize=(12.5, 4.0))
    for ax, (title, energy, lim, cap) in zip(axes, cases):
        sampler = MALASampler(energy)
        tuned = warmup(sampler, torch.randn(n_chains, 2, generator=gen(0)), n_warm, target_accept=0.6, generator=gen(1))
        x = sampler.sample(tuned.x, n_steps, step_size=tuned.step_size, generator=gen(2))
        contour(ax, energy, lim, cap)
        ax.scatter(x[:, 0], x[:, 1], s=2, c="white", edgecolors="none", alpha=0.6)
        ax.set(
            xlim=lim[:2],
            ylim=lim[2:],
            title=f"{title}\nMALA, step {float(tuned.step_size):.2f}, acc {tuned.acceptance:.2f}",
            xlabel="$x_1$",
            ylabel="$x_2$",
        )
        ax.set_aspect("equal", adjustable="box")
    fig.suptitle(f"Energy landscapes E(x) (darker = lower energy) with {n_chains} MALA samples after {n_steps} steps", y=1.02)
    return save(fig, out, "landscapes.png")


def traces(out: Path, quick: bool) -> Path:
    """x₁ over iterations on a double well, for ULA, MALA, HMC and NUTS, with the gradient cost."""
    n_steps = 60 if quick else 400
    energy = ebmcore.energy("double_well", dim=2, barrier=2.0)
    x0 = 0.5 * torch.randn(64, 2, generator=gen(3)) + torch.tensor([1.0, 1.0])
    runs = []
    ula = LangevinSampler(energy, step_size=0.02)
    runs.append(("ULA", ula, "1 gradient / step"))
    for name, sampler in [
        ("MALA", MALASampler(energy)),
        ("HMC", HMCSampler(energy, n_leapfrog_steps=8)),
        ("NUTS", NUTSSampler(energy, step_size=0.3)),
    ]:
        tuned = warmup(sampler, x0, 50 if quick else 300, target_accept=0.8 if name != "MALA" else 0.6, generator=gen(4))
        cost = {"MALA": "1 gradient / step", "HMC": "8 gradients / step", "NUTS": "adaptive trajectory"}[name]
        sampler.params = tuned.params  # the tuned step size and, for HMC/NUTS, inverse mass
        runs.append((name, sampler, cost))
    fig, axes = plt.subplots(len(runs), 1, figsize=(10, 7.5), sharex=True)
    for ax, (name, sampler, cost) in zip(axes, runs):
        lengths = []
        callback = (lambda i, s, info: lengths.append(float(info.mean_trajectory_length))) if name == "NUTS" else None
        result = sampler.sample(x0, n_steps, return_trajectory=True, generator=gen(5), callback=callback)
        draws = result.trajectory  # (n_steps, n_chains, 2)
        ess = float(diagnostics.ess_bulk(draws[:, :, :1]).squeeze())
        if name == "NUTS":
            cost = f"{sum(lengths) / len(lengths):.1f} gradients / step (mean)"
        for c in range(3):
            ax.plot(draws[:, c, 0].numpy(), lw=0.8)
        h = sampler.params.step_size
        ax.set_ylabel("$x_1$")
        ax.set_ylim(-2, 2)
        ax.text(
            1.01,
            0.5,
            f"{name}\nstep {float(h):.2f}\n{cost}\nbulk ESS of $x_1$: {ess:.0f}\n({draws.shape[1]} chains)",
            transform=ax.transAxes,
            va="center",
            fontsize=8.5,
        )
    axes[-1].set_xlabel("iteration (kept states after each step)")
    fig.suptitle("Trace plots on the double well E = 2 Σ (xᵢ² − 1)²: three of 64 chains per sampler", y=0.995)
    fig.tight_layout()
    return save(fig, out, "traces.png")


def step_sizes(out: Path, quick: bool) -> Path:
    """Acceptance of MALA and HMC against the step size, and the O(h) bias of ULA."""
    dim = 10
    n_chains, n_steps = (100, 20) if quick else (1000, 100)
    energy = ebmcore.energy("gaussian", covariance=torch.diag(torch.linspace(0.5, 2.0, dim)))
    x0 = torch.randn(n_chains, dim, generator=gen(6)) * torch.linspace(0.5, 2.0, dim).sqrt()
    hs = torch.logspace(-1.5, 0.3, 6 if quick else 14).tolist()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11.5, 4.0))
    for name, make in [("MALA", lambda: MALASampler(energy)), ("HMC", lambda: HMCSampler(energy, n_leapfrog_steps=5))]:
        acc = []
        for h in hs:
            result = make().sample(x0, n_steps, step_size=h, return_diagnostics=True, generator=gen(7))
            acc.append(float(result.diagnostics.acceptance_rate.mean()))
        ax1.semilogx(hs, acc, "o-", color=COLORS[name], label=name)
    ax1.axhspan(0.5, 0.65, color=COLORS["MALA"], alpha=0.12, label="MALA target ≈ 0.57")
    ax1.axhspan(0.65, 0.9, color=COLORS["HMC"], alpha=0.10, label="HMC/NUTS target 0.65–0.9")
    ax1.set(
        xlabel="step size h",
        ylabel="mean acceptance rate",
        ylim=(0, 1.02),
        title=f"Acceptance vs step size\n{dim}-d Gaussian, variances 0.5…2",
    )
    ax1.legend(fontsize=8, loc="lower left")
    # ULA on E = x²/2 (1-d, variance 1) has the stationary variance 1/(1 − h/2): an O(h) bias.
    target = ebmcore.energy("harmonic", dim=1)
    hs2 = [0.05, 0.1, 0.2, 0.4, 0.6, 0.8] if not quick else [0.1, 0.4]
    n2, steps2 = (2000, 100) if quick else (20000, 400)
    var_ula, var_mala = [], []
    for h in hs2:
        x = LangevinSampler(target, step_size=h).sample(torch.randn(n2, 1, generator=gen(8)), steps2, generator=gen(9))
        var_ula.append(float(x.var()))
        x = MALASampler(target, step_size=h).sample(torch.randn(n2, 1, generator=gen(8)), steps2, generator=gen(9))
        var_mala.append(float(x.var()))
    fine = torch.linspace(0.02, 0.85, 100)
    ax2.plot(fine, 1 / (1 - fine / 2), "k--", lw=1, label="ULA theory 1/(1 − h/2)")
    ax2.plot(hs2, var_ula, "o", color=COLORS["ULA"], label=f"ULA, {n2} chains")
    ax2.plot(hs2, var_mala, "s", color=COLORS["MALA"], label="MALA (exact)")
    ax2.axhline(1.0, color="grey", lw=0.8)
    ax2.set(xlabel="step size h", ylabel="sample variance (target 1)", title="ULA is biased by O(h); MALA is not\nE = x²/2")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    return save(fig, out, "step_size.png")


def tempering(out: Path, quick: bool) -> Path:
    """Two separated modes: MALA keeps each chain's starting mode, parallel tempering restores the weights."""
    n_chains, n_steps = (100, 40) if quick else (1000, 400)
    energy = ebmcore.energy(
        "gaussian_mixture", means=torch.tensor([[-3.0, 0.0], [3.0, 0.0]]), stds=0.5, weights=torch.tensor([0.2, 0.8])
    )
    x0 = torch.randn(n_chains, 2, generator=gen(10))
    mala = MALASampler(energy, step_size=0.2).sample(x0, n_steps, generator=gen(11))
    pt = ParallelTemperingSampler(
        energy, base="mala", temperatures=[1.0, 3.0, 9.0, 27.0], base_options={"step_size": 0.2}
    ).sample(x0, n_steps, generator=gen(11))
    fig, axes = plt.subplots(1, 3, figsize=(12.5, 3.6), gridspec_kw={"width_ratios": [1.4, 1.4, 1]})
    for ax, x, title in [(axes[0], mala, "MALA"), (axes[1], pt, "parallel tempering (MALA, T = 1, 3, 9, 27)")]:
        contour(ax, energy, (-5.5, 5.5, -2.5, 2.5), 12.0)
        ax.scatter(x[:, 0], x[:, 1], s=2, c="white", edgecolors="none", alpha=0.6)
        ax.set(title=f"{title}\n{n_chains} chains, {n_steps} steps", xlabel="$x_1$", ylabel="$x_2$")
        ax.set_aspect("equal", adjustable="box")
    shares = [float((x[:, 0] < 0).float().mean()) for x in (mala, pt)]
    axes[2].bar(["target", "MALA", "PT"], [0.2] + shares, color=["grey", COLORS["MALA"], COLORS["PT"]])
    axes[2].set(ylabel="share of samples in the left mode", title="left-mode weight (target 0.2)", ylim=(0, 0.7))
    for i, v in enumerate([0.2] + shares):
        axes[2].text(i, v + 0.01, f"{v:.2f}", ha="center", fontsize=9)
    fig.tight_layout()
    return save(fig, out, "tempering.png")


def autocorrelation(out: Path, quick: bool) -> Path:
    """Autocorrelation of x₁ for MALA, HMC and NUTS after warm-up, on a 10-d Gaussian."""
    dim = 10
    n_chains, n_steps = (20, 40) if quick else (100, 400)
    energy = ebmcore.energy("gaussian", covariance=torch.diag(torch.linspace(0.5, 2.0, dim)))
    x0 = torch.randn(n_chains, dim, generator=gen(12))
    fig, ax = plt.subplots(figsize=(7, 3.8))
    for name, sampler in [
        ("MALA", MALASampler(energy)),
        ("HMC", HMCSampler(energy, n_leapfrog_steps=5)),
        ("NUTS", NUTSSampler(energy, step_size=0.5)),
    ]:
        tuned = warmup(sampler, x0, 40 if quick else 300, target_accept=0.8 if name != "MALA" else 0.6, generator=gen(13))
        sampler.params = tuned.params
        draws = sampler.sample(tuned.x, n_steps, return_trajectory=True, generator=gen(14)).trajectory  # (n_steps, n_chains, dim)
        rho = diagnostics.autocorrelation(draws[:, :, -1:], max_lag=min(40, n_steps - 1))  # the widest coordinate
        ess = float(diagnostics.ess_bulk(draws[:, :, -1:]).squeeze())
        ax.plot(
            rho.mean(1).squeeze().numpy(),
            "o-",
            ms=3,
            color=COLORS[name],
            label=f"{name} (step {float(tuned.step_size):.2f}): bulk ESS {ess:.0f} of {n_steps * n_chains}",
        )
    ax.axhline(0, color="grey", lw=0.8)
    ax.set(
        xlabel="lag (iterations)",
        ylabel="autocorrelation (mean over chains)",
        title=f"Autocorrelation of x₁₀ (variance 2) on a {dim}-d Gaussian, after warm-up",
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    return save(fig, out, "autocorrelation.png")


def training(out: Path, quick: bool) -> Path:
    """Sliced score matching on eight Gaussians: loss curve, data, learned density, model samples."""
    steps = 60 if quick else 1500
    data = datasets.make("eight_gaussians", 4000, generator=gen(15))  # (4000, 2)
    energy = ebmcore.MLPEnergy(dim=2, hidden=(64, 64), seed=0)
    trainer = Trainer(
        energy, SlicedScoreMatching(n_projections=1, variance_reduction=True), data, batch_size=256, lr=2e-3, seed=0
    )
    history = trainer.fit(steps)
    sampler = MALASampler(energy, step_size=0.02)
    x = sampler.sample(torch.empty(1000, 2).uniform_(-4, 4, generator=gen(16)), 50 if quick else 500, generator=gen(17))
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.9), gridspec_kw={"width_ratios": [1.3, 1, 1]})
    losses = torch.tensor(history.losses)
    window = max(1, len(losses) // 50)
    smooth = losses.unfold(0, window, 1).mean(1) if window > 1 else losses
    axes[0].plot(history.steps, losses.numpy(), color="lightgrey", lw=0.7, label="per step")
    axes[0].plot(history.steps[window - 1 :], smooth.numpy(), color=COLORS["MALA"], label=f"moving mean ({window} steps)")
    axes[0].set(xlabel="training step", ylabel="loss", title="sliced score matching loss (MLP 2-64-64-1)")
    axes[0].legend(fontsize=8)
    axes[1].scatter(data[:, 0], data[:, 1], s=1, alpha=0.4, color="k")
    axes[1].set(title="data: eight Gaussians", xlim=(-4, 4), ylim=(-4, 4))
    X, Y, E = grid(energy, (-4, 4, -4, 4), 150)
    log_density = (-(E - E.min())).clip(min=-10.0)  # log exp(−E), up to a constant
    axes[2].imshow(log_density, extent=(-4, 4, -4, 4), origin="lower", cmap="magma")
    axes[2].scatter(x[:, 0], x[:, 1], s=1, c="cyan", alpha=0.5)
    axes[2].set(title=f"learned log-density −E after {steps} steps\n(10 nats of range), 1000 MALA samples")
    for ax in axes[1:]:
        ax.set_aspect("equal")
    fig.tight_layout()
    return save(fig, out, "training.png")


def benchmarks(out: Path, quick: bool) -> Path:
    """Peer time over ebm time per workload, from the committed benchmark results (the latest run of each)."""
    runs = [json.loads(path.read_text()) for path in BENCHMARK_JSONS]
    workloads = {wid: (w, run["meta"]) for run in runs for wid, w in run["workloads"].items()}
    names, ratios = [], {"torchebm": [], "blackjax": []}
    for wid, (w, _) in workloads.items():
        res = w["results"]
        what = w["workload"]["what"].split(",")[0].split(" (")[0].replace("one contrastive-divergence", "one CD-10")
        names.append(f"{wid}: {what}" + (" (equal ESS)" if w["workload"]["kind"] == "nuts" else ""))
        for peer in ratios:
            ratios[peer].append(res[peer]["median_s"] / res["ebm"]["median_s"] if peer in res else float("nan"))
    fig, ax = plt.subplots(figsize=(9, 0.36 * len(names) + 1.4))
    ys = torch.arange(len(names), dtype=torch.float32)
    for k, (peer, color) in enumerate([("torchebm", "#e6ab02"), ("blackjax", "#386cb0")]):
        ax.barh(ys + (k - 0.5) * 0.38, ratios[peer], height=0.36, color=color, label=f"{peer} time / ebm time")
    ax.axvline(1.0, color="k", lw=1)
    ax.set_xscale("log")
    ax.set_yticks(ys.numpy(), names, fontsize=8)
    ax.invert_yaxis()
    meta = runs[0]["meta"]
    days = sorted({run["meta"]["date"][:10] for run in runs})
    dates = days[0] if len(days) == 1 else f"{days[0]} to {days[-1]}"
    commits = ", ".join(
        f"{'/'.join(w for w, (_, m) in workloads.items() if m is run['meta'])} at {run['meta']['git']['commit']}"
        for run in runs[::-1]
    )
    ax.set(
        xlabel="ratio of median times (> 1: ebm faster; log scale)",
        title=f"ebm against torchebm 0.8.9 and BlackJAX 1.7.1, CPU, {meta['threads']} thread, {dates}\n({commits})",
    )
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    return save(fig, out, "benchmarks.png")


TWO_MOONS_NOISE = 0.1  # ebm_losses.datasets.make_two_moons's default


def true_nll(name: str, test: torch.Tensor) -> float:
    """The held-out NLL of the data's own density: the checkerboard is uniform on 8 squares of side 2 (area 32); two
    moons is two half circles, scaled by 2, convolved with N(0, 0.1²I): log p by quadrature over the arc (4,000 points)."""
    if name == "checkerboard":
        return math.log(32.0)
    t = (torch.arange(4000, dtype=torch.float64) + 0.5) * (math.pi / 4000)
    upper = 2 * torch.stack([t.cos() - 0.5, t.sin() - 0.25], 1)
    lower = 2 * torch.stack([0.5 - t.cos(), 0.25 - t.sin()], 1)
    centres = torch.cat([upper, lower])  # (8000, 2), each of weight 1/8000
    var = TWO_MOONS_NOISE**2
    d2 = torch.cdist(test.double(), centres).square()
    log_p = torch.logsumexp(-d2 / (2 * var), 1) - math.log(len(centres)) - math.log(2 * math.pi * var)
    return float(-log_p.mean())


def toys(out: Path, quick: bool) -> Path:
    """Four training methods on two moons and the checkerboard: exp(−E) beside the data, with each model's held-out NLL
    by quadrature against the data's own density; the NLLs also go to ``toys.json`` beside the figure."""
    from ebm_losses import BoltzmannEnergy, DenoisingScoreMatching, EnergyMatching, EquilibriumMatching, NoiseConditionalEnergy
    from ebm_losses.train_job import grid_nll

    def scale(steps: int) -> int:
        return max(4, steps // 200) if quick else steps

    def dsm(train):
        energy = NoiseConditionalEnergy([2], hidden=[128, 128], sigma_min=0.1, sigma_max=2.0, seed=0)
        return (
            Trainer(
                energy, DenoisingScoreMatching(sigma_range=[0.1, 2.0]), train, batch_size=256, lr=2e-3, seed=0, ema_decay=0.99
            ),
            scale(8000),
            lambda m: m,
        )

    def flow_cd(train):
        loss = EnergyMatching(scale(1000), temperature=1.0, flow_weight=0.0, n_steps=30, step_size=0.005)
        return (
            Trainer(
                ebmcore.MLPEnergy(dim=2, hidden=(64, 64), seed=0), loss, train, batch_size=256, lr=2e-3, seed=0, ema_decay=0.99
            ),
            scale(4000),
            lambda m: BoltzmannEnergy(m, 1.0),
        )

    def energy_matching(train):
        loss = EnergyMatching(scale(1000), temperature=0.1, n_steps=20, step_size=0.01)
        return (
            Trainer(
                ebmcore.MLPEnergy(dim=2, hidden=(64, 64), seed=0), loss, train, batch_size=256, lr=2e-3, seed=0, ema_decay=0.99
            ),
            scale(2000),
            lambda m: BoltzmannEnergy(m, 0.1),
        )

    def eqm(train):
        return (
            Trainer(
                ebmcore.MLPEnergy(dim=2, hidden=(128, 128), seed=0),
                EquilibriumMatching(),
                train,
                batch_size=256,
                lr=2e-3,
                seed=0,
                ema_decay=0.99,
            ),
            scale(3000),
            None,
        )  # T chosen on the training split below

    methods = {
        "multi-level DSM (σ_min 0.1)": dsm,
        "flow warm-up, then CD": flow_cd,
        "energy matching (ε = 0.1)": energy_matching,
        "EqM-E (T chosen on train)": eqm,
    }
    n_grid = 60 if quick else 300
    results: dict = {"quick": quick, "grid": f"{n_grid}² over [−4, 4]²", "datasets": {}}
    fig, axes = plt.subplots(2, 1 + len(methods), figsize=(3.1 * (1 + len(methods)), 6.4))
    for row, name in enumerate(("two_moons", "checkerboard")):
        g = gen(30 + row)
        train, test = datasets.make(name, 8000, generator=g), datasets.make(name, 2000, generator=g)
        exact = true_nll(name, test)
        record = {"true_nll": exact, "methods": {}}
        axes[row, 0].scatter(test[:, 0], test[:, 1], s=1, alpha=0.4, color="k")
        axes[row, 0].set(title=f"{name.replace('_', ' ')}: held-out data\n(true NLL {exact:.3f} nats)")
        for col, (label, build) in enumerate(methods.items(), start=1):
            start = time.perf_counter()
            trainer, steps, density = build(train)
            diverged = None
            try:
                trainer.fit(steps)
            except ebmcore.DivergenceError as exc:  # the watchdog's verdict is a result: the last good state is drawn
                diverged = str(exc).split(":")[0]
            model = trainer.ema.module
            if density is None:  # EqM-E: exp(−E/T), T picked by the training split's NLL
                temperature = min(
                    (0.05, 0.1, 0.2, 0.5, 1.0), key=lambda t: grid_nll(BoltzmannEnergy(model, t), train, 4.0, n=n_grid)
                )
                density = BoltzmannEnergy(model, temperature)
                label_t = f"{label.split(' (')[0]} (T = {temperature:g})"
            else:
                density, label_t = density(model), label
            nll = grid_nll(density, test, 4.0, n=n_grid)
            record["methods"][label_t] = {
                "held_out_nll": nll,
                "gap": nll - exact,
                "steps": steps,
                "diverged": diverged,
                "rollbacks": trainer.watchdog_report()["rollbacks"],
                "seconds": round(time.perf_counter() - start, 1),
            }
            X, Y, E = grid(density, (-4, 4, -4, 4), 150)
            axes[row, col].imshow((-(E - E.min())).clip(min=-10.0), extent=(-4, 4, -4, 4), origin="lower", cmap="magma")
            axes[row, col].set(
                title=f"{label_t}\nNLL {nll:.3f} (gap {nll - exact:+.3f})"
                + (f"\n{diverged}: its last good state" if diverged else "")
            )
        results["datasets"][name] = record
    for ax in axes.flat:
        ax.set(xlim=(-4, 4), ylim=(-4, 4), xticks=[], yticks=[])
        ax.set_aspect("equal")
    fig.suptitle("log exp(−E) (10 nats of range) of each method, beside the held-out data; NLL in nats by quadrature")
    fig.tight_layout()
    (out / "toys.json").write_text(json.dumps(results, indent=1) + "\n")
    return save(fig, out, "toys.png")


FIGURES = [landscapes, traces, step_sizes, tempering, autocorrelation, training, benchmarks, toys]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "assets" / "figures", help="output directory")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test, the figures mean little")
    parser.add_argument("--only", default="", help="comma-separated figure functions to run (default: all)")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch.set_num_threads (default 1: small batches run faster on one thread, and a busy "
        "machine does not slow them down by oversubscription)",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    only = {s for s in args.only.split(",") if s}
    for make in FIGURES:
        if only and make.__name__ not in only:
            continue
        start = time.perf_counter()
        path = make(args.out, args.quick)
        print(f"{path} ({time.perf_counter() - start:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
