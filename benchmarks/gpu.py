#!/usr/bin/env python
"""GPU workloads G1-G3 of WORKLOADS.md: Langevin on analytic energies at 1,000,000 chains, eager vs
compiled vs the ebm-cuda kernels (and torchebm's Triton kernels where importable), in fp32 (G1) and
bf16/fp16 state (G2), and W4/W5 at 100x the batch (G3): the eager per-step loop, the same loop through
torch.compile (the same noise from the same generator: its samples, W5's loss and gradient must agree with
eager's to float rounding; ``w4_same_noise`` is that comparison at a test's size), ebm's default path, and
torchebm's ``LangevinDynamics`` and ``ContrastiveDivergence`` where torchebm imports (drawing from the same generator,
its W4 samples agree with the eager loop's where it draws the same normals in the same order).

    benchmarks/.venv/bin/python benchmarks/gpu.py [--json benchmarks/results/<date>-gpu.json]
        [--groups G1,G2,G3] [--repeats 5] [--quick] [--device cuda]

``--device cpu --quick`` runs every row that does not need CUDA or Triton on the CPU (the ebm-cuda
rows then use the same kernels' host build, the ``cpu_fused`` backend), for testing this script;
CPU timings are not G1-G3 figures. Needs only torch, numpy and the ebm packages (ebmcore,
ebm-samplers, ebm-losses, ebm-cuda); torchebm and Triton rows are skipped, with the reason printed,
when they cannot be imported.

Rows of G1/G2, per energy (Gaussian dim 10 with W1's seeded SPD covariance, step 0.01; double well
dim 2, barrier 1, step 0.01; Rosenbrock dim 10, a = 1, b = 100, step 1e-4, the largest of
1e-3/3e-4/1e-4 at which no chain of 200,000 diverged in 1,000 steps from N(0, I)); all from the same
seeded ``x0 ~ N(0, I)``:

  (a) eager:     ``LangevinSampler(E, fused=False)`` under ``ebmcore.use_backend("torch")`` (per-step loop)
  (a2) ebm per-step with the backends' own kernels (``fused=False`` under ``use_backend("cuda", "torch")``: the
       ``cuda`` backend's gradient and ``langevin_step`` kernels on a GPU, even where they rank below torch; on the
       CPU this is (a), not repeated)
  (b) compiled:  ``LangevinSampler(E, fused=False, compile=True)`` under ``use_backend("torch")``
  (c) fused:     ``LangevinSampler(E, fused=True)``: ``<energy>_langevin_chain``, one launch for all steps
  (d) 1-step:    the same op called with ``n_steps=1`` once per step (the same Philox stream as (c));
                 the bandwidth row: state bytes read + written per step (2 n d itemsize) / time per step
  (e) torchebm:  ``torchebm.cuda.fused_langevin.doublewell_langevin_chain`` (double well only;
                 ``barrier_height=1, b=1, noise_scale=1``: ebm's double well and ULA), and
                 ``fused_langevin_step`` after an eager analytic gradient, once per step

plus, per dtype, the step kernels alone on a fixed gradient (``ebm_cuda`` ``langevin_step_philox``,
torchebm ``fused_langevin_step``), and the device's copy bandwidth (``y.copy_(x)`` of 1 GiB,
2 bytes / time). Every timing is the median of ``--repeats`` runs after one warm-up run (which
includes any compilation), ``torch.cuda.synchronize()`` before and after each, and comes with a
correctness figure from the warm-up run's output: z-scores of the sample moments against the exact
law after the run's steps (Gaussian: mean and covariance against the ULA law; double well: E[x^2]
against the ULA law on a grid, with the target's quadrature value beside it), for Rosenbrock the
non-finite chains and the mean energy compared with row (a)'s (two-sample z). See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import platform
import statistics
import sys
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run as common  # noqa: E402  (shared seeds, problem data and exact laws; imports only numpy at module level)

Z_TOL = common.Z_TOL
GROUPS = ("G1", "G2", "G3", "S", "T")  # S: the seeds' figures S1-S4 of WORKLOADS.md on this device; T: the Triton
# chains' launch configurations (benchmarks/triton_sweep.py)


@dataclass(frozen=True)
class Sizes:
    n_chains: int
    n_steps: int
    w4_chains: int
    w4_steps: int
    w5_batch: int
    w5_inner: int  # training steps per timed W5 run (reported per step)
    copy_bytes: int


FULL = Sizes(1_000_000, 1_000, 1_000_000, 100, 102_400, 5, 1 << 30)
QUICK = Sizes(4_096, 20, 4_096, 10, 1_024, 2, 1 << 24)

ENERGIES = {  # name: (dim, step size)
    "gaussian": (10, 0.01),
    "double_well": (2, 0.01),
    "rosenbrock": (10, 1e-4),
}


# ----------------------------------------------------------------------------------------------
# Timing
# ----------------------------------------------------------------------------------------------


def sync(device: Any) -> None:
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def measure(fn: Callable[[], Any], repeats: int, device: Any) -> dict:
    """One warm-up call (its output kept for the correctness figures), then ``repeats`` timed calls,
    each between two ``torch.cuda.synchronize()``."""
    import gc

    sync(device)
    t0 = time.perf_counter()
    out = fn()
    sync(device)
    first = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
        gc.collect()
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return {
        "out": out,
        "first_s": first,
        "times_s": times,
        "median_s": statistics.median(times),
        "min_s": min(times),
        "max_s": max(times),
    }


def copy_bandwidth(device: Any, nbytes: int, repeats: int) -> dict:
    """The device's copy bandwidth: ``y.copy_(x)`` of ``nbytes`` (float32), 2 * nbytes / median time."""
    import torch

    x = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    y = torch.empty_like(x)
    m = measure(lambda: y.copy_(x), max(repeats, 10), device)
    return {"bytes": nbytes, "median_s": m["median_s"], "times_s": m["times_s"], "GBps": 2 * nbytes / m["median_s"] / 1e9}


# ----------------------------------------------------------------------------------------------
# Problems
# ----------------------------------------------------------------------------------------------


def make_energy(name: str, device: Any, dtype: Any = None) -> Any:
    """ebm's energy; the Gaussian's parameters (buffers) in ``dtype`` (default float32; they are made in
    float32, the Cholesky factorisation having no bfloat16/float16 kernels, and then cast)."""
    import torch

    import ebmcore

    d, _ = ENERGIES[name]
    if name == "gaussian":
        cov = torch.tensor(common.gaussian_covariance(d), dtype=torch.float32)
        energy = ebmcore.GaussianEnergy(torch.zeros(d), covariance=cov, device=device)
        return energy if dtype in (None, torch.float32) else energy.to(dtype)
    if name == "double_well":
        return ebmcore.DoubleWellEnergy(dim=d, barrier=1.0)
    return ebmcore.RosenbrockEnergy(dim=d, a=1.0, b=100.0)


def make_x0(n: int, d: int, device: Any, dtype: Any) -> Any:
    """The seeded ``x0 ~ N(0, I)``, drawn on the CPU (the same on every device) and moved."""
    return common.make_x0(n, d).to(device=device, dtype=dtype)


def rosenbrock_energy64(x: Any) -> Any:
    import torch

    x = x.to(torch.float64)
    head, tail = x[:, :-1], x[:, 1:]
    return (100.0 * (tail - head * head) ** 2 + (1.0 - head) ** 2).sum(-1)


def correctness(name: str, x: Any, n_steps: int, ref: dict | None = None) -> dict:
    """Correctness figures of final states ``x`` (any dtype/device) for energy ``name`` after ``n_steps``."""
    import torch

    d, h = ENERGIES[name]
    x64 = x.detach().to(torch.float64)
    finite = torch.isfinite(x64).all(1)
    fig: dict[str, Any] = {"nonfinite_chains": int((~finite).sum())}
    if name == "rosenbrock":
        e = rosenbrock_energy64(x64[finite])
        fig["mean_energy"] = float(e.mean())
        fig["var_energy"] = float(e.var())
        fig["n_finite"] = int(finite.sum())
        if ref is not None and "mean_energy" in ref:
            se = math.sqrt(fig["var_energy"] / fig["n_finite"] + ref["var_energy"] / ref["n_finite"])
            fig["mean_energy_z_vs_eager"] = (fig["mean_energy"] - ref["mean_energy"]) / se
            fig["moments_z_max"] = abs(fig["mean_energy_z_vs_eager"])
            fig["moments_ok"] = bool(fig["moments_z_max"] <= Z_TOL)
        return fig
    if fig["nonfinite_chains"]:
        fig["moments_ok"] = False
        return fig
    xs = x64.cpu().numpy()
    if name == "gaussian":
        law = common.ula_gaussian_law(common.gaussian_covariance(d), h, n_steps)
        z_mean, z_cov = common.moment_z_scores(xs, np.zeros(d), law)
        fig.update(
            mean_z_max=z_mean,
            cov_z_max=z_cov,
            moments_z_max=max(z_mean, z_cov),
            cov_err_vs_ula_law=float(np.abs(np.cov(xs, rowvar=False) - law).max()),
        )
    else:
        m2, v2 = common.ula_double_well_law(h, n_steps)
        fig["mean_x2"] = float((xs * xs).mean())
        fig["mean_abs_x"] = float(np.abs(xs).mean())
        fig["mean_x2_ula_law"] = m2
        fig["mean_x2_quadrature"] = common.double_well_x2()
        fig["mean_x2_se"] = math.sqrt(v2 / xs.size)
        fig["mean_x2_z"] = (fig["mean_x2"] - m2) / fig["mean_x2_se"]
        fig["moments_z_max"] = abs(fig["mean_x2_z"])
    fig["moments_ok"] = bool(fig["moments_z_max"] <= Z_TOL)
    return fig


def format_correctness(name: str, fig: dict) -> str:
    if "error" in fig:
        return fig["error"]
    parts = []
    ok = ("ok" if fig.get("moments_ok") else "**FAIL**") + f": ≤ {Z_TOL:g}"
    if name == "gaussian" and "mean_z_max" in fig:
        parts.append(
            f"max z vs ULA law: mean {fig['mean_z_max']:.1f}, cov {fig['cov_z_max']:.1f} ({ok}); "
            f"cov err vs law {fig['cov_err_vs_ula_law']:.4f}"
        )
    if name == "double_well" and "mean_x2" in fig:
        parts.append(
            f"E[x²] {fig['mean_x2']:.4f} (ULA law {fig['mean_x2_ula_law']:.4f} ± {fig['mean_x2_se']:.4f}, "
            f"z {fig['mean_x2_z']:+.1f}, {ok}; quadrature {fig['mean_x2_quadrature']:.4f}), E|x| {fig['mean_abs_x']:.4f}"
        )
    if name == "rosenbrock":
        parts.append(f"mean E {fig['mean_energy']:.4f}")
        if "mean_energy_z_vs_eager" in fig:
            parts.append(f"z vs {fig.get('reference', '(a)')} {fig['mean_energy_z_vs_eager']:+.1f} ({ok})")
    if fig.get("nonfinite_chains"):
        parts.append(f"**{fig['nonfinite_chains']:,} non-finite chains**")
    elif name == "rosenbrock":
        parts.append("all finite")
    if "max_abs_diff_vs_c" in fig:
        parts.append(f"max abs diff vs (c) {fig['max_abs_diff_vs_c']:.1e}")
    return ", ".join(parts)


# ----------------------------------------------------------------------------------------------
# Availability
# ----------------------------------------------------------------------------------------------


def triton_reason(device: Any) -> str | None:
    import torch

    if torch.device(device).type != "cuda":
        return "needs a CUDA device (Triton kernels)"
    try:
        import triton  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        return f"triton not importable ({type(exc).__name__}: {exc})"
    return None


def torchebm_fused() -> Any:
    """``torchebm.cuda.fused_langevin``, or the reason it cannot be imported (a str)."""
    try:
        from torchebm.cuda import fused_langevin
    except Exception as exc:  # noqa: BLE001
        return f"torchebm.cuda.fused_langevin not importable ({type(exc).__name__}: {exc})"
    return fused_langevin


def kernel_reason(device: Any, dtype: Any, op: str) -> str | None:
    """Why ebm has no kernel for ``op`` here (None if it has): the ``cuda`` backend on GPUs, ``cpu_fused`` on CPUs."""
    import torch

    import ebmcore

    dev = torch.device(device)
    backend = "cuda" if dev.type == "cuda" else "cpu_fused"
    try:
        why = ebmcore.explain(op, device=dev, dtype=dtype, backend=backend)
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {exc}"
    if why.chosen is None:
        return "; ".join(f"{c.backend}: {c.reason}" for c in why.candidates)
    return None


def cpu_matmul_reason(n: int, d: int, dtype: Any) -> str | None:
    """On the CPU, whether a ``(n, d) @ (d, d)`` matmul in ``dtype`` runs, probed in a subprocess: on some
    virtual machines oneDNN's bfloat16 path dies with SIGILL (AMX advertised but not usable), which no
    ``try`` can catch."""
    import subprocess

    dt = str(dtype).removeprefix("torch.")
    code = f"import torch; torch.randn({n}, {d}).to(torch.{dt}) @ torch.randn({d}, {d}).to(torch.{dt})"
    try:
        rc = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120).returncode
    except Exception as exc:  # noqa: BLE001
        return f"the probe of a {dt} matmul failed to run ({type(exc).__name__})"
    if rc == 0:
        return None
    what = "SIGILL, an illegal instruction" if rc in (-4, 132) else f"exit status {rc}"
    return f"a ({n}, {d}) @ ({d}, {d}) {dt} matmul kills the process on this CPU ({what}; torch's oneDNN path)"


def fused_seed(device: Any) -> int:
    """The Philox key ``LangevinSampler(fused=True)`` draws from ``torch.Generator(device).manual_seed(SEED_NOISE)``
    (``ebmcore.sampler.stream_seed``), so that (d) runs (c)'s stream one step per call."""
    import torch

    from ebmcore.sampler import stream_seed

    return stream_seed(torch.Generator(device=device).manual_seed(common.SEED_NOISE), torch.device(device))


# ----------------------------------------------------------------------------------------------
# G1/G2 rows
# ----------------------------------------------------------------------------------------------


@dataclass
class Row:
    group: str
    energy: str
    dtype: str
    key: str
    label: str
    n: int
    d: int
    n_steps: int
    itemsize: int
    skipped: str | None = None
    timing: dict = field(default_factory=dict)
    figures: dict = field(default_factory=dict)
    note: str = ""

    def as_json(self, copy_gbps: float | None) -> dict:
        out = {k: v for k, v in self.__dict__.items() if k not in ("timing",)}
        if self.timing:
            t = {k: v for k, v in self.timing.items() if k != "out"}
            out["timing"] = t
            out["per_step_s"] = t["median_s"] / self.n_steps
            out["state_GBps"] = self.state_gbps()
            out["state_bw_fraction_of_copy"] = (out["state_GBps"] / copy_gbps) if copy_gbps else None
        return out

    def state_gbps(self) -> float:
        """Bytes of chain state read and written per step (2 n d itemsize) times steps, over the median time."""
        return 2 * self.n * self.d * self.itemsize * self.n_steps / self.timing["median_s"] / 1e9


def analytic_rows(group: str, name: str, dtype: Any, sizes: Sizes, device: Any, repeats: int, log: Callable) -> list[Row]:
    import torch

    import ebmcore
    from ebm_samplers import LangevinSampler

    d, h = ENERGIES[name]
    n, steps = sizes.n_chains, sizes.n_steps
    dname = str(dtype).removeprefix("torch.")
    dev = torch.device(device)
    x0 = make_x0(n, d, device, dtype)
    s = math.sqrt(2.0 * h)
    rows: list[Row] = []

    def row(key: str, label: str) -> Row:
        r = Row(group, name, dname, key, label, n, d, steps, x0.element_size())
        rows.append(r)
        return r

    def gen() -> Any:
        return torch.Generator(device=dev).manual_seed(common.SEED_NOISE)

    def attempt(r: Row, fn: Callable[[], Any], ctx: Callable[[], Any] | None = None) -> None:
        log(f"  {group} {name} {dname} {r.key}: {r.label} ...")
        try:
            if ctx is not None:
                with ctx():
                    r.timing = measure(fn, repeats, device)
            else:
                r.timing = measure(fn, repeats, device)
        except Exception as exc:  # noqa: BLE001 - a row that cannot run is reported, not fatal
            r.skipped = failure(exc)
            log(f"    {r.skipped}")
            return
        out = r.timing["out"]
        if out.dtype != x0.dtype:
            r.note = f"state came back as {str(out.dtype).removeprefix('torch.')}"
        if ref32 is not None:  # 16-bit state: the float32 run is the reference (row (a) rounds every step)
            r.figures = correctness(name, out, steps, ref32)
            r.figures["reference"] = "float32 eager"
        else:
            ref = rows[0].figures if rows and rows[0].key == "a" and rows[0].timing else None
            r.figures = correctness(name, out, steps, ref if name == "rosenbrock" and r.key != "a" else None)
        log(f"    median {r.timing['median_s'] * 1e3:.2f} ms; {format_correctness(name, r.figures)}")

    ref32 = None  # Rosenbrock in 16 bits: the reference is the same chains in float32, eager (untimed)
    if name == "rosenbrock" and dtype != torch.float32:
        log(f"  {group} {name} {dname}: the float32 eager reference (untimed) ...")
        with ebmcore.use_backend("torch"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            x32 = LangevinSampler(make_energy(name, device), step_size=h, fused=False).sample(x0.float(), steps, generator=gen())
        ref32 = correctness(name, x32, steps)
        del x32
    torch_reason = None  # why the torch rows (a, b) cannot run here
    if dev.type == "cpu" and name == "gaussian" and dtype != torch.float32:
        torch_reason = cpu_matmul_reason(n, d, dtype)
    label_a = "eager torch, per-step loop (use_backend('torch'), fused=False)"
    label_b = "torch.compile, per-step loop (use_backend('torch'), fused=False, compile=True)"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # non-finite chains are counted in the figures
        # (a) eager torch, per-step loop; the energy's parameters in the state's dtype
        e_state = make_energy(name, device, dtype if dtype in (torch.float16, torch.bfloat16) else None)
        if torch_reason:
            row("a", label_a).skipped = torch_reason
        else:
            sa = LangevinSampler(e_state, step_size=h, fused=False)
            attempt(row("a", label_a), lambda: sa.sample(x0, steps, generator=gen()), lambda: ebmcore.use_backend("torch"))

        energy = e_state  # the sampler refuses a state dtype other than the parameters' (no silent casts)
        # (a2) the per-step loop with the backends' own per-op kernels
        if dev.type == "cuda":
            sa2 = LangevinSampler(energy, step_size=h, fused=False)
            attempt(
                row("a2", "ebm per-step loop, cuda backend per-op kernels (fused=False)"),
                lambda: sa2.sample(x0, steps, generator=gen()),
                lambda: ebmcore.use_backend("cuda", "torch"),
            )
        else:
            row(
                "a2", "ebm per-step loop, backends' per-op kernels"
            ).skipped = "on the CPU the per-op kernels of cpu_fused rank below torch: the same as (a)"

        # (b) torch.compile of the per-step transition
        if torch_reason:
            row("b", label_b).skipped = torch_reason
        else:
            torch._dynamo.reset()  # a fresh compile: past the recompile limit dynamo would silently run eager
            sb = LangevinSampler(e_state, step_size=h, fused=False, compile=True)
            attempt(row("b", label_b), lambda: sb.sample(x0, steps, generator=gen()), lambda: ebmcore.use_backend("torch"))

        # (c) the fused chain: one launch for all steps
        op = f"{name}_langevin_chain"
        why = kernel_reason(device, dtype, op)
        label_c = f"ebm {'CUDA' if dev.type == 'cuda' else 'cpu_fused (host build)'} fused chain {op}, one launch (fused=True)"
        if why:
            row("c", label_c).skipped = why
        else:
            sc = LangevinSampler(energy, step_size=h, fused=True)
            attempt(row("c", label_c), lambda: sc.sample(x0, steps, generator=gen()))

        # (d) the same op, one step per call, on (c)'s Philox stream
        label_d = f"ebm {op} with n_steps=1, called once per step"
        if why:
            row("d", label_d).skipped = why
        else:
            kernel = ebmcore.resolve_kernel(op, dev, dtype, "cuda" if dev.type == "cuda" else "cpu_fused")
            args, seed = energy.kernel_args(), fused_seed(device)

            def one_step_loop() -> Any:
                x = x0
                for t in range(steps):
                    x = kernel.fn(x, *args, n_steps=1, step_size=h, noise_scale=s, seed=seed, offset=t)
                return x

            rd = row("d", label_d)
            attempt(rd, one_step_loop)
            rc = next(r for r in rows if r.key == "c")
            if rd.timing and rc.timing:
                diff = (rd.timing["out"].float() - rc.timing["out"].float()).abs()
                rd.figures["max_abs_diff_vs_c"] = float(diff[torch.isfinite(diff)].max()) if diff.numel() else 0.0

        # (e) torchebm's Triton kernels: the double-well chain, and the step after an eager gradient
        if name == "double_well":
            reason = triton_reason(device) or (None if dtype == torch.float32 else "torchebm's kernels take float32 only")
            mod = None if reason else torchebm_fused()
            if isinstance(mod, str):
                reason, mod = mod, None
            label_e1 = "torchebm Triton doublewell_langevin_chain (barrier_height=1, b=1, noise_scale=1), one launch"
            label_e2 = "torchebm Triton fused_langevin_step after an eager analytic gradient, per step"
            if reason:
                row("e1", label_e1).skipped = reason
                row("e2", label_e2).skipped = reason
            else:
                attempt(
                    row("e1", label_e1),
                    lambda: mod.doublewell_langevin_chain(
                        x0.clone(), steps, h, noise_scale=1.0, barrier_height=1.0, b=1.0, seed=common.SEED_NOISE
                    ),
                )

                def triton_step_loop() -> Any:
                    x = x0.clone()
                    for t in range(steps):
                        g = (x * x - 1.0).mul_(x).mul_(4.0)
                        mod.fused_langevin_step(x, g, h, 1.0, seed=common.SEED_NOISE + t, out=x)
                    return x

                attempt(row("e2", label_e2), triton_step_loop)
        for r in rows:
            if r.timing:
                r.timing["out"] = None  # free the device memory
    return rows


def step_kernel_rows(group: str, dtype: Any, sizes: Sizes, device: Any, repeats: int, log: Callable) -> list[Row]:
    """The single-step update kernels alone, on a fixed gradient (d = 10): ebm's ``langevin_step_philox``
    and torchebm's ``fused_langevin_step``; ``n_steps`` calls per timed run, the state updated in turn."""
    import torch

    import ebmcore

    d, h = 10, 0.01
    n, steps = sizes.n_chains, sizes.n_steps
    dev = torch.device(device)
    dname = str(dtype).removeprefix("torch.")
    x0 = make_x0(n, d, device, dtype)
    grad = (0.1 * x0).contiguous()
    rows = []

    r = Row(
        group,
        "step kernel only",
        dname,
        "k1",
        "ebm langevin_step_philox(x, fixed grad), per step",
        n,
        d,
        steps,
        x0.element_size(),
    )
    rows.append(r)
    why = kernel_reason(device, dtype, "langevin_step_philox")
    if why:
        r.skipped = why
    else:
        kernel = ebmcore.resolve_kernel("langevin_step_philox", dev, dtype, "cuda" if dev.type == "cuda" else "cpu_fused")

        def ebm_loop() -> Any:
            x = x0
            for t in range(steps):
                x = kernel.fn(x, grad, h, math.sqrt(2 * h), 12345, t)
            return x

        log(f"  {group} {dname} k1: {r.label} ...")
        r.timing = measure(ebm_loop, repeats, device)
        r.figures = {"nonfinite_chains": int((~torch.isfinite(r.timing["out"].float()).all(1)).sum())}
        r.note = "each call reads x and writes a new tensor (out of place: the state once each way)"
        r.timing["out"] = None

    r2 = Row(
        group,
        "step kernel only",
        dname,
        "k2",
        "torchebm Triton fused_langevin_step(x, fixed grad, out=x), per step",
        n,
        d,
        steps,
        x0.element_size(),
    )
    rows.append(r2)
    reason = triton_reason(device) or (None if dtype == torch.float32 else "torchebm's kernels take float32 only")
    mod = None if reason else torchebm_fused()
    if isinstance(mod, str):
        reason = mod
    if reason:
        r2.skipped = reason
    else:

        def triton_loop() -> Any:
            x = x0.clone()
            for t in range(steps):
                mod.fused_langevin_step(x, grad, h, 1.0, seed=t, out=x)
            return x

        log(f"  {group} {dname} k2: {r2.label} ...")
        r2.timing = measure(triton_loop, repeats, device)
        r2.figures = {"nonfinite_chains": int((~torch.isfinite(r2.timing["out"]).all(1)).sum())}
        r2.note = "in place; also reads the gradient (3 n d itemsize per step in all)"
        r2.timing["out"] = None
    return rows


# ----------------------------------------------------------------------------------------------
# G3: W4 and W5 at 100x the batch, eager vs compile
# ----------------------------------------------------------------------------------------------


def mlp_energy(device: Any) -> Any:
    return common.net_energy(common.make_mlp().to(device))


# G3's variants: the sampler options of each, and its label. "eager" and "compile" are the same per-step loop and
# draw the same noise from the same torch.Generator, so their samples agree to float rounding (compared); "default"
# is ebm's own path (fused=None: a fused chain or langevin_step_philox, noise from the Philox stream), which agrees
# with them in law only.
G3_VARIANTS: dict[str, tuple[dict, str]] = {
    "eager": ({"fused": False}, "eager per-step loop, fused=False"),
    "compile": ({"fused": False, "compile": True}, "torch.compile per-step loop, compile=True"),
    "default": ({}, "ebm's default path, fused=None"),
    "fused": ({"fused": True}, "ebm's fused chain, fused=True: the Triton chain on CUDA, the host build on the CPU"),
}
SAME_NOISE = ("eager", "compile")  # the variants whose samples must agree to float rounding


def failure(exc: BaseException) -> str:
    """A row's ``skipped`` text for a run that raised."""
    return f"failed: {common.error_text(exc)}"


def measured_or_skipped(rec: dict, out: list[dict], log: Callable, fn: Callable[[], Any]) -> Any:
    """``fn()``; where it raises, None, with ``rec`` marked skipped (:func:`failure`), logged and added to ``out``: a
    row that cannot run is reported, not fatal."""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001
        rec["skipped"] = failure(exc)
        log(f"    {rec['skipped']}")
        out.append(rec)
        return None


def w4_sampler(energy: Any, variant: str) -> Any:
    from ebm_samplers import LangevinSampler

    return LangevinSampler(energy, step_size=0.01, **G3_VARIANTS[variant][0])


def w4_path(sampler: Any, x0: Any) -> str:
    """The sampler's run path for ``x0`` (which kernels it runs, or why not)."""
    try:
        return sampler.prepare(x0, None, {}).path
    except Exception as exc:  # noqa: BLE001
        return f"unknown ({type(exc).__name__}: {exc})"


def w4_same_noise(n: int = 64, steps: int = 3, device: Any = "cpu") -> dict:
    """W4's "eager vs compiled, same noise" comparison at a small size (what a CPU test calls): the final states of
    the ``SAME_NOISE`` variants from the same seeded generator. Returns ``max_abs_diff`` and each variant's path."""
    import torch

    torch._dynamo.reset()
    energy = mlp_energy(device)
    energy.net.requires_grad_(False)
    x0 = make_x0(n, 2, device, torch.float32)
    out, paths = {}, {}
    for key in SAME_NOISE:
        sampler = w4_sampler(energy, key)
        paths[key] = w4_path(sampler, x0)
        out[key] = sampler.sample(x0, steps, generator=torch.Generator(device=device).manual_seed(common.SEED_NOISE))
    return {"max_abs_diff": float((out["compile"] - out["eager"]).abs().max()), "paths": paths}


def g3_rows(sizes: Sizes, device: Any, repeats: int, log: Callable) -> list[dict]:
    import torch

    dev = torch.device(device)
    out: list[dict] = []

    def gen() -> Any:
        return torch.Generator(device=dev).manual_seed(common.SEED_NOISE)

    # W4 at 100x: ULA on the MLP energy
    energy = mlp_energy(device)
    energy.net.requires_grad_(False)
    n, steps = sizes.w4_chains, sizes.w4_steps
    x0 = make_x0(n, 2, device, torch.float32)
    w4 = {}
    for key, (_, what) in G3_VARIANTS.items():
        label = f"W4 ×100: ULA on the MLP 2-64-64-1 SiLU, {n:,} chains, {steps} steps, step 0.01 ({what})"
        torch._dynamo.reset()  # a fresh compile: past the recompile limit dynamo would silently run eager
        sampler = w4_sampler(energy, key)
        rec: dict[str, Any] = {
            "workload": "W4x100",
            "variant": key,
            "label": label,
            "n": n,
            "n_steps": steps,
            "path": w4_path(sampler, x0),
        }
        log(f"  G3 {label} ...")
        m = measured_or_skipped(
            rec, out, log, lambda: measure(lambda: sampler.sample(x0, steps, generator=gen()), repeats, device)
        )
        if m is None:
            continue
        x = m.pop("out")
        with torch.no_grad():
            e = energy.net(x).squeeze(-1).double()
        rec.update(timing=m, figures={"mean_energy": float(e.mean()), "nonfinite_chains": int((~torch.isfinite(x).all(1)).sum())})
        w4[key] = x
        if key != "eager" and key in SAME_NOISE and "eager" in w4:  # the same torch.Generator draws: the samples agree
            rec["figures"]["max_abs_diff_vs_eager"] = float((x - w4["eager"]).abs().max())
        log(f"    median {m['median_s'] * 1e3:.1f} ms; mean E {rec['figures']['mean_energy']:.5f}; path: {rec['path']}")
        out.append(rec)
    out.append(torchebm_w4(energy, x0, steps, device, repeats, gen, log, w4.get("eager")))
    w4.clear()

    # W5 at 100x: one CD-10 training step (loss, backward, Adam)
    import ebm_losses

    data = common.make_eight_gaussians(sizes.w5_batch).to(device)
    base = mlp_energy(device)
    init = {k: v.detach().clone() for k, v in base.net.state_dict().items()}
    w5 = {}
    for key, (options, what) in G3_VARIANTS.items():
        label = (
            f"W5 ×100: one CD-10 training step (Langevin negatives, backward, Adam lr 1e-3), batch {sizes.w5_batch:,} "
            f"(sampler: {what})"
        )
        torch._dynamo.reset()
        loss = ebm_losses.ContrastiveDivergence("langevin", 10, sampler_options={"step_size": 0.01, **options})
        params = list(base.net.parameters())
        state: dict[str, Any] = {}

        def reset() -> None:
            with torch.no_grad():
                for k, t in base.net.state_dict().items():
                    t.copy_(init[k])
            state["opt"] = torch.optim.Adam(params, lr=1e-3)

        def train() -> Any:
            reset()
            g = gen()
            for _ in range(sizes.w5_inner):
                value = loss(base, data, generator=g)
                for q in params:
                    q.grad = None
                value.backward()
                state["opt"].step()
            return value

        rec = {"workload": "W5x100", "variant": key, "label": label, "batch": sizes.w5_batch, "inner": sizes.w5_inner}
        log(f"  G3 {label} ...")
        m = measured_or_skipped(rec, out, log, lambda: measure(train, repeats, device))
        if m is None:
            continue
        m.pop("out")
        for k in ("median_s", "min_s", "max_s"):  # per training step (the Adam state's creation included, once per run)
            m[k] /= sizes.w5_inner
        # correctness: the loss and its gradient on the initial weights (first step of a run)
        reset()
        value = loss(base, data, generator=gen())
        for q in params:
            q.grad = None
        value.backward()
        grads = torch.cat([q.grad.reshape(-1) for q in params]).double()
        fig = {"loss": float(value.detach()), "grad_norm": float(grads.norm())}
        if key != "eager" and key in SAME_NOISE and "eager" in w5:  # the same negatives' noise
            fig.update(common.relative_differences(fig["loss"], grads, w5["eager"], "eager"))
        w5[key] = (fig["loss"], grads)
        rec.update(timing=m, figures=fig)
        log(f"    median {m['median_s'] * 1e3:.1f} ms per step; loss {fig['loss']:.6g}")
        out.append(rec)
    out.append(torchebm_w5(data, init, sizes, device, repeats, gen, log))
    out += conv_pcd_rows(device, repeats, log, inner=sizes.w5_inner)
    return out


CONV_PCD = {"widths": (32, 64), "image": (1, 8, 8), "batch": 64, "buffer": 2000, "k": 20, "step_size": 10.0, "noise_scale": 0.005}
"""The conv-energy PCD step of ``benchmarks/image_step.py`` (``ebm train digits``'s), on uniform images in [-1, 1]: the
issue's graph-capture target is measured on it (default path: a captured graph on CUDA, against ``fused=False``)."""


def conv_pcd_rows(device: Any, repeats: int, log: Callable, inner: int = 5) -> list[dict]:
    """One PCD training step of a ``ConvEnergy`` (20 Langevin steps, backward, Adam), ebm's default path against the
    per-step loop (``fused=False``), from the same generator: a captured graph draws what the loop draws, so the first
    step's loss and gradient agree to float rounding there."""
    import torch
    import ebm_losses

    c = CONV_PCD
    data = torch.rand(c["batch"], *c["image"], generator=torch.Generator().manual_seed(0)).mul_(2).sub_(1).to(device)
    base = ebm_losses.ConvEnergy(image_shape=c["image"], widths=c["widths"], seed=0).to(device)
    init = {k: v.detach().clone() for k, v in base.state_dict().items()}
    params = list(base.parameters())
    out, first = [], {}
    for key, options in (("eager", {"fused": False}), ("default", {})):
        label = (
            f"conv PCD step: ConvEnergy {c['widths']}, batch {c['batch']} of {c['image']}, {c['k']} Langevin steps "
            f"(h {c['step_size']:g}, σ {c['noise_scale']:g}), buffer {c['buffer']:,}, backward, Adam"
        )
        loss = ebm_losses.PersistentContrastiveDivergence(
            "langevin",
            c["k"],
            sampler_options={"step_size": c["step_size"], "noise_scale": c["noise_scale"], **options},
            buffer_size=c["buffer"],
            reinit_fraction=0.05,
            regularization=0.1,
        )
        state: dict[str, Any] = {}

        def gen() -> Any:
            return torch.Generator(device=device).manual_seed(common.SEED_NOISE)

        def first_step() -> tuple[float, Any]:
            with torch.no_grad():
                for k, t in base.state_dict().items():
                    t.copy_(init[k])
            value = loss(base, data, generator=gen())
            for q in params:
                q.grad = None
            value.backward()
            return float(value.detach()), torch.cat([q.grad.reshape(-1) for q in params]).double()

        def train() -> Any:
            g = state.setdefault("g", gen())
            opt = state.setdefault("opt", torch.optim.Adam(params, lr=1e-3))
            for _ in range(inner):
                value = loss(base, data, generator=g)
                opt.zero_grad(set_to_none=True)
                value.backward()
                opt.step()
            return value

        rec: dict[str, Any] = {"workload": "ConvPCD", "variant": key, "label": label, "batch": c["batch"], "inner": inner}
        log(f"  G3 {label} ({key}) ...")

        def run() -> tuple[float, Any, dict, str]:
            value, grads = first_step()
            m = measure(train, repeats, device)
            return value, grads, m, loss.sampler_for(base).prepare(data, state["g"], {}).path

        got = measured_or_skipped(rec, out, log, run)
        if got is None:
            continue
        value, grads, m, rec["path"] = got
        m.pop("out")
        for k in ("median_s", "min_s", "max_s"):
            m[k] /= inner
        fig = {"loss": value, "grad_norm": float(grads.norm())}
        if "eager" in first:
            fig.update(common.relative_differences(value, grads, first["eager"], "eager"))
        first[key] = (value, grads)
        rec.update(timing=m, figures=fig)
        log(f"    median {m['median_s'] * 1e3:.2f} ms per step; loss {value:.6g}")
        out.append(rec)
    return out


def torchebm_w4(
    energy: Any, x0: Any, steps: int, device: Any, repeats: int, gen: Callable, log: Callable, eager: Any = None
) -> dict:
    """W4 at 100x with torchebm 0.8.9: ``LangevinDynamics(model, step_size=0.01, noise_scale=1, device=...)`` (its ULA)
    on the same MLP, from the same ``x0`` and generator (where it draws the same normals in the same order as ebm's
    eager loop, ``eager``'s samples, the difference is reported); skipped, saying why, where torchebm does not import."""
    import torch

    label = (
        f"W4 ×100: ULA on the MLP 2-64-64-1 SiLU, {x0.shape[0]:,} chains, {steps} steps, step 0.01 (torchebm LangevinDynamics)"
    )
    rec: dict[str, Any] = {"workload": "W4x100", "variant": "torchebm", "label": label, "n": x0.shape[0], "n_steps": steps}
    try:
        from torchebm.samplers import LangevinDynamics

        model = _torchebm_mlp(energy.net, device)
        sampler = LangevinDynamics(model, step_size=0.01, noise_scale=1.0, device=device)
        log(f"  G3 {label} ...")
        m = measure(lambda: sampler.sample(x=x0, n_steps=steps, generator=gen()), repeats, device)
    except Exception as exc:  # noqa: BLE001 - not importable, or it failed: a row that says why
        rec["skipped"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
        log(f"    skipped: {rec['skipped']}")
        return rec
    x = m.pop("out")
    with torch.no_grad():
        e = energy.net(x.to(device)).squeeze(-1).double()
    rec.update(timing=m, figures={"mean_energy": float(e.mean()), "nonfinite_chains": int((~torch.isfinite(x).all(1)).sum())})
    if eager is not None and eager.shape == x.shape:
        rec["figures"]["max_abs_diff_vs_eager"] = float((x.to(eager.device) - eager).abs().max())
    log(f"    median {m['median_s'] * 1e3:.1f} ms; mean E {rec['figures']['mean_energy']:.5f}")
    return rec


def torchebm_w5(data: Any, init: dict, sizes: Sizes, device: Any, repeats: int, gen: Callable, log: Callable) -> dict:
    """W5 at 100x with torchebm 0.8.9: ``ContrastiveDivergence(model, LangevinDynamics(...), k_steps=10,
    persistent=False, energy_reg_weight=0)`` and Adam, from the same initial weights; skipped where it does not import."""
    import torch

    label = (
        f"W5 ×100: one CD-10 training step (Langevin negatives, backward, Adam lr 1e-3), batch {sizes.w5_batch:,} "
        "(torchebm ContrastiveDivergence)"
    )
    rec: dict[str, Any] = {
        "workload": "W5x100",
        "variant": "torchebm",
        "label": label,
        "batch": sizes.w5_batch,
        "inner": sizes.w5_inner,
    }
    try:
        from torchebm.losses import ContrastiveDivergence
        from torchebm.samplers import LangevinDynamics

        net = common.make_mlp().to(device)
        model = _torchebm_mlp(net, device)
        loss = ContrastiveDivergence(
            model,
            LangevinDynamics(model, step_size=0.01, noise_scale=1.0, device=device),
            k_steps=10,
            persistent=False,
            energy_reg_weight=0.0,
        )
        params = list(net.parameters())

        def train() -> Any:
            with torch.no_grad():
                for k, t in net.state_dict().items():
                    t.copy_(init[k])
            opt = torch.optim.Adam(params, lr=1e-3)
            g = gen()
            for _ in range(sizes.w5_inner):
                out = loss(data, generator=g)
                value = out[0] if isinstance(out, tuple) else out
                opt.zero_grad(set_to_none=True)
                value.backward()
                opt.step()
            return value

        log(f"  G3 {label} ...")
        m = measure(train, repeats, device)
    except Exception as exc:  # noqa: BLE001
        rec["skipped"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
        log(f"    skipped: {rec['skipped']}")
        return rec
    value = m.pop("out")
    for k in ("median_s", "min_s", "max_s"):
        m[k] /= sizes.w5_inner
    rec.update(timing=m, figures={"loss": float(value.detach())})  # (its loss after the run's last step)
    log(f"    median {m['median_s'] * 1e3:.1f} ms per step")
    return rec


def _torchebm_mlp(net: Any, device: Any) -> Any:
    """torchebm's model around ``net``: ``E(x) = net(x)``, on ``device``."""
    from torchebm.core import BaseModel

    class MLPModel(BaseModel):
        def __init__(self, inner: Any) -> None:
            super().__init__(device=device)
            self.net = inner

        def forward(self, x: Any) -> Any:
            return self.net(x).squeeze(-1)

    return MLPModel(net)


# ----------------------------------------------------------------------------------------------
# S1-S4: the figures the original guides quote (0.41 / 0.76 / 1.8 / 38 ms on their GPU)
# ----------------------------------------------------------------------------------------------

SEEDS = {  # id: (what, the guides' GPU figure in ms)
    "S1": ("one Langevin step, 1,000 chains, dim 10 (W1's Gaussian), step 0.01", 0.41),
    "S2": ("one HMC step, 1,000 chains, dim 10 (standard Gaussian, step 0.1, 10 leapfrog)", 0.76),
    "S3": ("energy gradient, 10,000 samples, dim 100 (a seeded SPD Gaussian)", 1.8),
    "S4": ("full Langevin sampling, 10,000 chains, 100 steps, dim 10 (W1's Gaussian), step 0.01", 38.0),
}
SEED_INNER = {"S1": 200, "S2": 50, "S3": 20, "S4": 1}  # calls per timed run (the figure is per call)


def seed_rows(device: Any, repeats: int, log: Callable, quick: bool = False) -> list[dict]:
    """S1-S4 with ebm's default path, ebm's per-step loop under the ``torch`` backend (eager) and torchebm where it
    imports; each timing with a correctness figure: S1/S2/S4 the sample moments after the run against the exact law
    (ULA's law after the steps taken; for HMC the target itself), S3 the gradient against float64's closed form."""
    import torch

    import ebmcore
    from ebm_samplers import HMCSampler, LangevinSampler

    dev = torch.device(device)
    scale = 10 if quick else 1
    recs: list[dict] = []

    def gen() -> Any:
        return torch.Generator(device=dev).manual_seed(common.SEED_NOISE)

    try:
        import torchebm  # noqa: F401
        from torchebm.core import GaussianModel, HarmonicModel
        from torchebm.samplers import HamiltonianMonteCarlo, LangevinDynamics

        torchebm_reason = None
    except Exception as exc:  # noqa: BLE001
        torchebm_reason = f"torchebm not importable ({type(exc).__name__}: {exc})"

    paths: dict[str, str] = {}  # S1, S2, S4: the path ebm's sampler takes
    for sid, (what, guide_ms) in SEEDS.items():
        n = (10_000 if sid in ("S3", "S4") else 1_000) // scale
        d = 100 if sid == "S3" else 10
        inner = max(1, SEED_INNER[sid] // scale)
        cov = common.gaussian_covariance(d) if sid != "S2" else np.eye(d)
        x0 = make_x0(n, d, dev, torch.float32)
        energy = (
            ebmcore.HarmonicEnergy(dim=d).to(dev)
            if sid == "S2"
            else ebmcore.GaussianEnergy(torch.zeros(d), covariance=torch.tensor(cov, dtype=torch.float32), device=dev)
        )
        law = {
            "S1": lambda: common.ula_gaussian_law(cov, 0.01, inner),
            "S2": lambda: np.eye(d),
            "S4": lambda: common.ula_gaussian_law(cov, 0.01, 100),
        }.get(sid)
        variants: dict[str, Any] = {}
        for variant in ("ebm", "eager", "torchebm"):
            if variant == "torchebm" and torchebm_reason:
                variants[variant] = torchebm_reason
                continue
            if sid == "S3":
                if variant == "torchebm":
                    model = GaussianModel(torch.zeros(d), torch.tensor(cov, dtype=torch.float32), device=dev)  # its own device=
                    variants[variant] = lambda m=model: m.gradient(x0)
                elif variant == "ebm":
                    variants[variant] = lambda: energy.gradient(x0)
                else:

                    def autograd_gradient() -> Any:
                        x = x0.detach().requires_grad_()
                        with ebmcore.use_backend("torch"):
                            return torch.autograd.grad(energy(x).sum(), x)[0]

                    variants[variant] = autograd_gradient
                continue
            if variant == "torchebm":
                model = (
                    HarmonicModel(k=1.0, device=dev)
                    if sid == "S2"
                    else GaussianModel(torch.zeros(d), torch.tensor(cov, dtype=torch.float32), device=dev)
                )
                sampler = (
                    HamiltonianMonteCarlo(model, step_size=0.1, n_leapfrog_steps=10, device=dev)
                    if sid == "S2"
                    else LangevinDynamics(model, step_size=0.01, noise_scale=1.0, device=dev)
                )
                sample = lambda x, k, g, s=sampler: s.sample(x=x, n_steps=k, generator=g)  # noqa: E731
            else:
                options = {"fused": False} if variant == "eager" else {}
                sampler = (
                    HMCSampler(energy, step_size=0.1, n_leapfrog_steps=10, **options)
                    if sid == "S2"
                    else LangevinSampler(energy, step_size=0.01, **options)
                )
                sample = lambda x, k, g, s=sampler: s.sample(x, k, generator=g)  # noqa: E731
                if variant == "ebm":
                    paths[sid] = common.ebm_path(sampler, x0)  # the fused chain and its backend, or the loop and why
            if sid == "S4":
                variants[variant] = lambda f=sample: f(x0, 100, gen())
            else:

                def one_step_calls(f=sample) -> Any:  # S1/S2: `inner` calls of one step each (per-call overhead included)
                    g, x = gen(), x0
                    for _ in range(inner):
                        x = f(x, 1, g)
                    return x

                variants[variant] = one_step_calls
        for variant, fn in variants.items():
            rec: dict[str, Any] = {
                "id": sid,
                "what": what,
                "variant": variant,
                "n": n,
                "d": d,
                "inner": inner,
                "guide_gpu_ms": guide_ms,
            }
            if isinstance(fn, str):
                rec["skipped"] = fn
                recs.append(rec)
                continue
            log(f"  {sid} {variant} ...")

            def timed(fn: Callable = fn, variant: str = variant) -> dict:
                with ebmcore.use_backend("torch") if variant == "eager" else contextlib.nullcontext():
                    return measure(fn, repeats, dev)

            m = measured_or_skipped(rec, recs, log, timed)
            if m is None:
                continue
            out = m.pop("out")
            m["per_call_s"] = m["median_s"] / inner
            if out.device != x0.device:  # a result on another device than the states (torchebm's own device=)
                rec["note"] = f"result on {out.device}, states on {x0.device}"
            if sid == "S3":
                exact = x0.double().cpu() @ torch.linalg.inv(torch.tensor(cov, dtype=torch.float64))
                fig = {"max_rel_err_vs_float64": float((out.detach().double().cpu() - exact).abs().max() / exact.abs().max())}
                fig["ok"] = fig["max_rel_err_vs_float64"] <= 1e-4
            else:
                xs = out.detach().double().cpu().numpy()
                z_mean, z_cov = common.moment_z_scores(xs, np.zeros(d), law())
                fig = {"mean_z_max": z_mean, "cov_z_max": z_cov, "ok": bool(max(z_mean, z_cov) <= Z_TOL)}
            if variant == "ebm" and sid in paths:
                rec["path"] = paths[sid]
            rec.update(timing=m, figures=fig)
            log(f"    {1e3 * m['per_call_s']:.3f} ms per call; {fig}")
            recs.append(rec)
    return recs


def seed_table(recs: list[dict]) -> str:
    head = "| id | what | implementation | per call (ms) | min–max per call (ms) | the guides' GPU figure (ms) | ratio vs ebm | correctness |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    ebm = {r["id"]: r for r in recs if r["variant"] == "ebm" and "timing" in r}
    for r in recs:
        if "skipped" in r:
            lines.append(
                f"| {r['id']} | {r['what']} | {r['variant']} | — | — | {r['guide_gpu_ms']} | — | skipped: {r['skipped']} |"
            )
            continue
        t, f, k = r["timing"], r["figures"], r["inner"]
        e = ebm.get(r["id"])
        ratio = f"{t['median_s'] / e['timing']['median_s']:.2f}" if e else "—"
        ok = "ok" if f["ok"] else "**FAIL**"
        corr = (
            f"max rel err vs float64 {f['max_rel_err_vs_float64']:.1e} ({ok})"
            if "max_rel_err_vs_float64" in f
            else f"max z vs exact law: mean {f['mean_z_max']:.1f}, cov {f['cov_z_max']:.1f} ({ok}: ≤ {Z_TOL:g})"
        )
        if r.get("path"):
            corr += f"; path: {r['path']}"
        lines.append(
            f"| {r['id']} | {r['what']} | {r['variant']} | {1e3 * t['median_s'] / k:.3f} | "
            f"{1e3 * t['min_s'] / k:.3f}–{1e3 * t['max_s'] / k:.3f} | {r['guide_gpu_ms']} | {ratio} | {corr} |"
        )
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------------------------


def analytic_table(rows: list[Row], copy_gbps: float | None) -> str:
    head = (
        "| | implementation | median (ms) | min–max (ms) | first call (ms) | per step (µs) | speed-up vs (a) "
        "| state GB/s (% of copy) | correctness |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    eager = next((r for r in rows if r.key == "a" and r.timing), None)
    for r in rows:
        if r.skipped:
            lines.append(f"| {r.key} | {r.label} | — | — | — | — | — | — | skipped: {r.skipped} |")
            continue
        t = r.timing
        speed = f"{eager.timing['median_s'] / t['median_s']:.2f}" if eager else "—"
        gbps = r.state_gbps()
        bw = f"{gbps:.0f}" + (f" ({100 * gbps / copy_gbps:.0f} %)" if copy_gbps else "")
        if r.key in ("c", "e1"):
            bw += " effective"
        corr = format_correctness(r.energy, r.figures)
        if r.note:
            corr += f"; {r.note}"
        lines.append(
            f"| {r.key} | {r.label} | {1e3 * t['median_s']:.2f} | {1e3 * t['min_s']:.2f}–{1e3 * t['max_s']:.2f} | "
            f"{1e3 * t['first_s']:.0f} | {1e6 * t['median_s'] / r.n_steps:.2f} | {speed} | {bw} | {corr} |"
        )
    return "\n".join(lines)


def kernel_table(rows: list[Row], copy_gbps: float | None) -> str:
    head = "| | kernel | median per step (µs) | state GB/s (% of copy) | notes |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        if r.skipped:
            lines.append(f"| {r.key} | {r.label} | — | — | skipped: {r.skipped} |")
            continue
        gbps = r.state_gbps()
        bw = f"{gbps:.0f}" + (f" ({100 * gbps / copy_gbps:.0f} %)" if copy_gbps else "")
        bad = f"; **{r.figures['nonfinite_chains']} non-finite**" if r.figures.get("nonfinite_chains") else ""
        lines.append(f"| {r.key} | {r.label} | {1e6 * r.timing['median_s'] / r.n_steps:.2f} | {bw} | {r.note}{bad} |")
    return "\n".join(lines)


def g3_table(recs: list[dict]) -> str:
    head = "| workload | variant | median (ms) | min–max (ms) | first call (ms) | speed-up vs eager | correctness |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    eager = {r["workload"]: r for r in recs if r["variant"] == "eager" and "timing" in r}
    for r in recs:
        if "skipped" in r:
            lines.append(f"| {r['label']} | {r['variant']} | — | — | — | — | skipped: {r['skipped']} |")
            continue
        t, f = r["timing"], r["figures"]
        e = eager.get(r["workload"])
        speed = f"{e['timing']['median_s'] / t['median_s']:.2f}" if e else "—"
        if r["workload"] == "W4x100":
            corr = f"mean E {f['mean_energy']:.5f}"
            if f.get("nonfinite_chains"):
                corr += f", **{f['nonfinite_chains']} non-finite chains**"
            if "max_abs_diff_vs_eager" in f:
                corr += f", max abs diff vs eager ({'same noise' if r['variant'] in SAME_NOISE else 'same generator'}) {f['max_abs_diff_vs_eager']:.1e}"
            if r.get("path"):
                corr += f"; path: {r['path']}"
            per = ""
        else:
            corr = f"loss {f['loss']:.6g}" + (
                f", grad norm {f['grad_norm']:.5g}" if "grad_norm" in f else " (after the last step)"
            )
            if "loss_rel_diff_vs_eager" in f:
                corr += f", rel diff vs eager: loss {f['loss_rel_diff_vs_eager']:.1e}, gradient {f['grad_rel_diff_vs_eager']:.1e}"
            if r.get("path"):
                corr += f"; path: {r['path']}"
            per = " per step"
        lines.append(
            f"| {r['label']} | {r['variant']} | {1e3 * t['median_s']:.2f}{per} | {1e3 * t['min_s']:.2f}–{1e3 * t['max_s']:.2f} "
            f"| {1e3 * t['first_s']:.0f} | {speed} | {corr} |"
        )
    return "\n".join(lines)


def versions(device: Any) -> dict:
    import torch

    import ebmcore

    v: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "ebmcore": ebmcore.__version__,
    }
    dev = torch.device(device)
    if dev.type == "cuda":
        v["gpu"] = torch.cuda.get_device_name(dev)
        v["compute_capability"] = ".".join(map(str, torch.cuda.get_device_capability(dev)))
        v["gpu_memory_GiB"] = round(torch.cuda.get_device_properties(dev).total_memory / 2**30, 1)
    else:
        v["gpu"] = None
        v["cpu"] = common.machine()
    for mod in ("ebm_samplers", "ebm_losses", "ebm_cuda", "torchebm", "triton"):
        try:
            v[mod] = getattr(__import__(mod), "__version__", "?")
        except Exception as exc:  # noqa: BLE001
            v[mod] = f"not importable ({type(exc).__name__})"
    try:
        import ebm_cuda

        v["ebm_cuda_backend"] = (
            ebm_cuda.cuda_unavailable_reason() if dev.type == "cuda" else ebm_cuda.host_unavailable_reason()
        ) or "available"
    except Exception:  # noqa: BLE001
        pass
    return v


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--groups",
        default=",".join(GROUPS),
        help="comma-separated: G1, G2, G3, S (S1-S4), T (the Triton chains' configurations); default: all",
    )
    ap.add_argument("--energies", default=",".join(ENERGIES), help="comma-separated (G1/G2): " + ", ".join(ENERGIES))
    ap.add_argument(
        "--repeats", type=int, default=5, help="timed runs per row after one warm-up (median reported; >= 5 for figures)"
    )
    ap.add_argument("--device", default="cuda", help="cuda (default), cuda:N, or cpu (with --quick: a test of this script)")
    ap.add_argument("--json", metavar="PATH", help="write the raw timings and figures here")
    ap.add_argument("--quick", action="store_true", help=f"small sizes ({QUICK.n_chains:,} chains, {QUICK.n_steps} steps)")
    args = ap.parse_args(argv)
    args.groups = [g.strip().upper() for g in args.groups.split(",") if g.strip()]
    args.energies = [e.strip() for e in args.energies.split(",") if e.strip()]
    for g in args.groups:
        if g not in GROUPS:
            ap.error(f"unknown group {g!r}; choose from {', '.join(GROUPS)}")
    for e in args.energies:
        if e not in ENERGIES:
            ap.error(f"unknown energy {e!r}; choose from {', '.join(ENERGIES)}")
    if args.repeats < 1:
        ap.error("--repeats must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    dev = torch.device(args.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        print(
            f"--device {args.device}: no CUDA device is visible (torch {torch.__version__}, CUDA {torch.version.cuda}). "
            "Run on a GPU machine, or test this script with --device cpu --quick.",
            file=sys.stderr,
        )
        return 2
    if dev.type == "cuda" and dev.index is not None:
        torch.cuda.set_device(dev)
    sizes = QUICK if args.quick else FULL

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    meta = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": " ".join([os.path.relpath(sys.executable), *sys.argv]),
        "device": str(dev),
        "quick": args.quick,
        "repeats": args.repeats,
        "sizes": sizes.__dict__,
        "versions": versions(dev),
        "git": common.git_state(),
        "loadavg_start": common.loadavg(),
        "torch_threads": torch.get_num_threads(),
    }
    v = meta["versions"]
    print(f"# ebm GPU workloads (G1–G3) — {meta['date']}\n")
    where = (
        f"GPU: {v['gpu']} (compute capability {v['compute_capability']}, {v['gpu_memory_GiB']} GiB)"
        if v.get("gpu")
        else f"**no GPU: device {dev}** ({v.get('cpu')}; {meta['torch_threads']} torch threads) — a test of the script, "
        "not G1–G3 figures"
    )
    print(where)
    print(
        "versions: "
        + ", ".join(f"{k} {val}" for k, val in v.items() if k not in ("gpu", "cpu", "compute_capability", "gpu_memory_GiB"))
    )
    gs = meta["git"]
    print(f"ebm commit: {gs['commit']}" + (f" + uncommitted changes in {', '.join(gs['modified'])}" if gs["modified"] else ""))
    print(f"command: {meta['command']}")
    print(
        f"sizes: {sizes.n_chains:,} chains × {sizes.n_steps:,} steps (G1/G2); W4 {sizes.w4_chains:,} chains × {sizes.w4_steps} steps; "
        f"W5 batch {sizes.w5_batch:,}{' (QUICK)' if args.quick else ''}; {args.repeats} timed runs after one warm-up, median\n"
    )

    log("copy bandwidth ...")
    bw = copy_bandwidth(dev, sizes.copy_bytes, args.repeats)
    copy_gbps = bw["GBps"]
    print(
        f"Copy bandwidth (`y.copy_(x)`, {sizes.copy_bytes / 2**30:g} GiB float32, 2 × bytes / median time): "
        f"**{copy_gbps:.0f} GB/s**\n"
    )
    report: dict[str, Any] = {
        "meta": meta,
        "copy_bandwidth": bw,
        "analytic": [],
        "step_kernels": [],
        "g3": [],
        "seeds": [],
        "triton": [],
    }

    def save() -> None:  # after every table: a run cut short by a time limit keeps what it measured
        if args.json:
            os.makedirs(os.path.dirname(os.path.abspath(args.json)) or ".", exist_ok=True)
            with open(args.json, "w") as f:
                json.dump(report, f, indent=1, default=str)

    dtypes: list[tuple[str, Any]] = []
    if "G1" in args.groups:
        dtypes.append(("G1", torch.float32))
    if "G2" in args.groups:
        dtypes += [("G2", torch.bfloat16), ("G2", torch.float16)]
    for group, dtype in dtypes:
        dname = str(dtype).removeprefix("torch.")
        for name in args.energies:
            d, h = ENERGIES[name]
            t0 = time.perf_counter()
            rows = analytic_rows(group, name, dtype, sizes, dev, args.repeats, log)
            print(
                f"## {group}: Langevin (ULA), {name.replace('_', ' ')} dim {d}, {dname} state, "
                f"{sizes.n_chains:,} chains, {sizes.n_steps:,} steps, step {h:g}\n"
            )
            print(analytic_table(rows, copy_gbps))
            print(f"\n({time.perf_counter() - t0:.0f} s)\n", flush=True)
            report["analytic"] += [r.as_json(copy_gbps) for r in rows]
            save()
        krows = step_kernel_rows(group, dtype, sizes, dev, args.repeats, log)
        print(f"### {group}: the single-step kernels alone ({dname}, dim 10, fixed gradient, {sizes.n_steps:,} calls per run)\n")
        print(kernel_table(krows, copy_gbps) + "\n", flush=True)
        report["step_kernels"] += [r.as_json(copy_gbps) for r in krows]
        save()
    if "G3" in args.groups:
        t0 = time.perf_counter()
        recs = g3_rows(sizes, dev, args.repeats, log)
        print(
            "## G3: W4 and W5 at 100× the batch: the eager per-step loop, the same loop compiled (the same noise), ebm's default path (float32)\n"
        )
        print(g3_table(recs))
        print(f"\n({time.perf_counter() - t0:.0f} s)\n", flush=True)
        report["g3"] = recs
        save()
    if "S" in args.groups:
        t0 = time.perf_counter()
        recs = seed_rows(dev, args.repeats, log, quick=args.quick)
        print("## S1–S4: the figures the original guides quote, on this device (ratio: time / ebm's time)\n")
        print(seed_table(recs))
        print(f"\n({time.perf_counter() - t0:.0f} s)\n", flush=True)
        report["seeds"] = recs
        save()
    if "T" in args.groups:
        import triton_sweep

        t0 = time.perf_counter()
        # CUDA: G3's sizes; the CPU: the interpreter's (or rows skipped, saying why, without it). Saved row by row.
        d = triton_sweep.DRY
        n = (
            (sizes.w4_chains, sizes.w4_steps, sizes.w5_batch)
            if dev.type == "cuda"
            else (d["w4_chains"], d["w4_steps"], d["cd_chains"])
        )
        recs = triton_sweep.sweep_rows(*n, dev, args.repeats, log, measure, out=report["triton"], saved=save)
        print("## T: the Triton chains' launch configurations (W4, and W5's contrastive chain), float32\n")
        print(triton_sweep.sweep_table(recs, Z_TOL))
        print(f"\n({time.perf_counter() - t0:.0f} s)\n", flush=True)
    meta["loadavg_end"] = common.loadavg()
    print(
        "State GB/s = 2 × chains × dim × itemsize × steps / median time (the chain state read and written once per "
        "step); for the one-launch chains (c, e1) an *effective* figure: they touch memory once per run, not per step, "
        f"so it may exceed the copy bandwidth. Correctness: |z| ≤ {Z_TOL:g} against the exact law after the run's steps."
    )
    if args.json:
        save()
        print(f"\nraw results written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
