#!/usr/bin/env python
"""The kernel checks of ``gpu_check.py``: every ``.cu`` entry point (energy, gradient, Langevin/HMC/NUTS chains, the
two step kernels, the normals and Philox) in every dtype on CUDA against the host build, on the same Philox stream;
non-contiguous and offset inputs; the caller's stream; CUDA-graph capture; a 2^24-chain launch; refusals.

    python benchmarks/gpu_check_kernels.py [--dry | --emulated LIB] [--sizes full|memcheck|racecheck|dry] [--json PATH]

``--dry`` runs the same comparisons host build against host build on the CPU at tiny sizes (what CI runs, so this
script cannot rot). ``--emulated LIB`` runs them with ``kernels.cu`` itself built for the host (``LIB`` from
``ebm_cuda.build.build_cuda_emulated()``, its blocks' threads OS threads) in place of the CUDA build, on CPU tensors:
what CI runs under AddressSanitizer and ThreadSanitizer (``plugins/ebm_cuda/tests/test_cuda_emulation.py``).
``--sizes memcheck`` (the default with ``--emulated``) / ``racecheck`` are the small odd-sized runs ``gpu_check.py``
launches under ``compute-sanitizer`` (kernel entry points only, no graph capture or side streams). Prints one line per
check; ``--json`` writes them as ``[{name, status, reason, seconds}]``. Exit status 1 if a check failed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import time
import traceback
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Callable, ContextManager

import torch


@dataclass(frozen=True)
class Sizes:
    n: int  # chains of the comparisons (odd: a partial last block)
    dims: tuple[int, ...]  # each MAXD class of the chain kernels, and its edges
    dtypes: tuple[torch.dtype, ...]
    big: int  # chains of the big launch (0: not run)
    steps: int  # Langevin steps of a comparison


ALL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
SIZES = {
    "full": Sizes(1000, (1, 3, 5, 8, 13, 16, 17, 33, 64), ALL_DTYPES, 2**24 + 3, 20),
    "memcheck": Sizes(333, (1, 3, 8, 16, 17, 33, 64), ALL_DTYPES, 0, 3),
    "racecheck": Sizes(333, (3, 17, 40), (torch.float32, torch.bfloat16), 0, 2),
    "dry": Sizes(37, (1, 3, 17, 64), ALL_DTYPES, 2**12 + 3, 5),
}


class Checks:
    """Runs named checks, each in its own try, and records ``{name, status, reason, seconds}``."""

    def __init__(self, device: str, path: str | None) -> None:
        self.device, self.path = device, path
        self.results: list[dict] = []

    def run(self, name: str, fn: Callable[[], str | None]) -> None:
        t0 = time.perf_counter()
        status, reason = "passed", ""
        try:
            note = fn()
            if self.device == "cuda":
                torch.cuda.synchronize()
            if isinstance(note, str) and note.startswith("skipped: "):
                status, reason = "skipped", note.removeprefix("skipped: ")
            else:
                reason = note or ""
        except Exception as exc:  # noqa: BLE001 - every check reports, the next one runs
            status, reason = "failed", f"{type(exc).__name__}: {str(exc)[:1500]}"
            traceback.print_exc(limit=4)
        seconds = time.perf_counter() - t0
        self.results.append({"name": name, "status": status, "reason": reason, "seconds": round(seconds, 3)})
        print(f"{status.upper():7s} {name}" + (f": {reason}" if reason else "") + f" ({seconds:.1f} s)", flush=True)
        if self.path:  # after every check: what ran survives a crash of the process
            with open(self.path, "w") as f:
                json.dump(self.results, f, indent=1)


class Side:
    """A backend's kernels (``.kernels[name].fn``), each called inside ``context()``: with ``--emulated``,
    ``testing.cuda_emulation`` (the emulated CUDA build), else nothing."""

    def __init__(self, backend: Any, context: Callable[[], ContextManager]) -> None:
        def inside(fn: Callable) -> Callable:
            def run(*args: Any, **kwargs: Any) -> Any:
                with context():
                    return fn(*args, **kwargs)

            return run

        self.kernels = {name: SimpleNamespace(fn=inside(kernel.fn)) for name, kernel in backend.kernels.items()}


def close(a: torch.Tensor, b: torch.Tensor, tol: float, what: str) -> None:
    torch.testing.assert_close(
        a.detach().cpu().double(), b.detach().cpu().double(), rtol=tol, atol=tol, equal_nan=True, msg=lambda m: f"{what}: {m}"
    )


@dataclass(frozen=True)
class Run:
    """What every check needs: the sizes, where the "gpu" side runs (``gpu``: the CUDA build, or with ``--dry`` the
    host build, or with ``--emulated`` the ``.cu`` build on the CPU, each call inside ``on_gpu()``) and the host
    build it is compared with, on device ``dev``."""

    sizes: Sizes
    gpu: Any
    host: Any
    dev: str
    on_gpu: Callable[[], ContextManager]
    no_gpu: bool
    sanitizer: bool
    dry: bool
    emulated: Any

    def on_dev(self, args: list) -> list:
        return [a.to(self.dev) if isinstance(a, torch.Tensor) else a for a in args]


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    where = ap.add_mutually_exclusive_group()
    where.add_argument("--dry", action="store_true", help="host build against host build on the CPU, tiny sizes")
    where.add_argument(
        "--emulated",
        metavar="LIB",
        help="kernels.cu built for the host (build.build_cuda_emulated()) against the host build, on the CPU",
    )
    ap.add_argument("--sizes", choices=sorted(SIZES), help="default: dry with --dry, memcheck with --emulated, else full")
    ap.add_argument("--json", metavar="PATH", help="write the checks here")
    return ap.parse_args(argv)


def _recorded(path: str) -> Any:
    """The emulated CUDA build, recording in ``ran`` the entry points called (``ebm_cuda_<name>``)."""
    from ebm_cuda import library

    class Recorded(library.Library):
        def __init__(self, path: str) -> None:
            super().__init__(path, "cuda")
            self.ran: set[str] = set()

        def call(self, name: str, *args: Any) -> None:
            self.ran.add(name)
            super().call(name, *args)

    return Recorded(path)


# 1. every energy x dtype x dim: energy, gradient, Langevin (per-chain h and s), HMC, NUTS against the host build
def energy_checks(run: Run, name: str, dtype: torch.dtype) -> str:
    from ebm_cuda.testing import assert_chains_close, assert_most_chains_close
    from ebmcore.kernels.ops import sample_inputs

    notes = []
    lo = dtype != torch.float32
    for d in run.sizes.dims:
        x, *params = sample_inputs(f"{name}_energy", run.sizes.n, d, dtype=torch.float32)
        x = (0.3 * x if name in ("rosenbrock", "double_well") else x).to(dtype)
        gp = run.on_dev(params)
        tol = 2e-2 if lo else 1e-4
        for op in (f"{name}_energy", f"{name}_gradient"):
            close(run.gpu.kernels[op].fn(x.to(run.dev), *gp), run.host.kernels[op].fn(x, *params), tol, f"{op} d={d}")
        h = 1e-3 if name == "rosenbrock" else 0.01
        hv = torch.full((x.shape[0],), h) * (1 + 0.5 * torch.rand(x.shape[0], generator=torch.Generator().manual_seed(d)))
        kw = dict(n_steps=run.sizes.steps, step_size=hv, noise_scale=(2 * hv) ** 0.5, seed=123, offset=2**33 + 9)
        g = run.gpu.kernels[f"{name}_langevin_chain"].fn(
            x.to(run.dev), *gp, **{**kw, "step_size": hv.to(run.dev), "noise_scale": kw["noise_scale"].to(run.dev)}
        )
        c = run.host.kernels[f"{name}_langevin_chain"].fn(x, *params, **kw)
        assert g.dtype == dtype and g.shape == x.shape, (g.dtype, g.shape)
        # 16-bit: both round once at the end; a float32 ulp flip may move one 16-bit ulp
        ltol = 2 * torch.finfo(dtype).eps * max(1.0, c.float().abs().nan_to_num().max().item()) if lo else 1e-4
        assert_chains_close(g, c, rtol=0 if lo else ltol, atol=ltol, what=f"langevin d={d}")
        kw = dict(
            n_steps=4 if not run.sanitizer else 2, step_size=h, n_leapfrog_steps=3, inverse_temperature=0.9, seed=7, offset=3
        )
        gx, ga, gd = run.gpu.kernels[f"{name}_hmc_chain"].fn(x.to(run.dev), *gp, **kw)
        hx, ha, hd = run.host.kernels[f"{name}_hmc_chain"].fn(x, *params, **kw)
        same = (ga.cpu() == ha) & (gd.cpu() == hd)
        assert same.float().mean() > 0.99, f"hmc d={d}: accept counts differ in {int((~same).sum())} chains"
        assert_chains_close(gx.cpu()[same], hx[same], rtol=2e-2 if lo else 1e-4, atol=2e-2 if lo else 1e-4, what=f"hmc d={d}")
        kw = dict(
            n_steps=3 if not run.sanitizer else 1,
            step_size=10 * h,
            max_tree_depth=6 if not run.sanitizer else 3,
            inverse_temperature=1.0,
            seed=5,
            offset=1,
        )
        G = run.gpu.kernels[f"{name}_nuts_chain"].fn(x.to(run.dev), *gp, **kw)
        H = run.host.kernels[f"{name}_nuts_chain"].fn(x, *params, **kw)
        same = (G[3].cpu() == H[3]) & (G[4].cpu() == H[4]) & (G[2].cpu() == H[2])  # the same trees
        assert same.float().mean() > 0.98, f"nuts d={d}: trees differ in {int((~same).sum())} chains"
        # the same trees may still pick different states where a weight is within rounding of the uniform
        apart = assert_most_chains_close(
            G[0].cpu()[same], H[0][same], rtol=2e-2 if lo else 1e-3, atol=2e-2 if lo else 1e-3, what=f"nuts d={d}"
        )
        close(G[1].cpu()[same], H[1][same], 1e-3, f"nuts acceptance d={d}")
        if (~same).any():
            notes.append(f"d={d}: {int((~same).sum())} NUTS trees differ")
        if apart:
            notes.append(f"d={d}: {apart} NUTS chains with the same tree picked another state")
    return "; ".join(notes)


# 2. the step kernels (langevin_update, langevin_step), the normals and Philox
def steps(run: Run) -> None:
    from ebm_cuda import philox

    n = run.sizes.n
    for dtype in run.sizes.dtypes:
        x, g, z = (torch.randn(n, 11, generator=torch.Generator().manual_seed(i)).to(dtype) for i in range(3))
        hv = torch.rand(n, generator=torch.Generator().manual_seed(3)) * 0.1
        a = run.gpu.kernels["langevin_step_philox"].fn(x.to(run.dev), g.to(run.dev), hv.to(run.dev), 0.3, 99, 2**40 + 1)
        b = run.host.kernels["langevin_step_philox"].fn(x, g, hv, 0.3, 99, 2**40 + 1)
        close(a, b, 1e-5 if dtype == torch.float32 else torch.finfo(dtype).eps * 8, f"langevin_step_philox {dtype}")
        a = run.gpu.kernels["langevin_step"].fn(x.to(run.dev), g.to(run.dev), z.to(run.dev), 0.05, hv.to(run.dev))
        b = run.host.kernels["langevin_step"].fn(x, g, z, 0.05, hv)
        close(a, b, 1e-6 if dtype == torch.float32 else torch.finfo(dtype).eps * 4, f"langevin_step {dtype}")
    with run.on_gpu():
        a = philox.normal(70 * n + 1, 9, 3, 2**35 + 7, device=run.dev)
    close(a, philox.normal(70 * n + 1, 9, 3, 2**35 + 7), 1e-6, "normal")
    gen = torch.Generator().manual_seed(0)
    counters, keys = torch.randint(0, 2**32, (n, 4), generator=gen), torch.randint(0, 2**32, (n, 2), generator=gen)
    with run.on_gpu():
        a = philox.philox4x32(counters.to(run.dev), keys.to(run.dev))
    assert torch.equal(a.cpu(), philox.philox4x32(counters, keys)), "philox"


# 3. layouts: column slices, transposed storage, a storage offset, non-contiguous parameters, one chain
def layouts(run: Run) -> None:
    from ebmcore.kernels.ops import sample_inputs

    x, m, p = sample_inputs("gaussian_energy", run.sizes.n, 6, dtype=torch.float32)
    xg, mg, pg = x.to(run.dev), m.to(run.dev), p.to(run.dev)
    f = run.gpu.kernels["gaussian_langevin_chain"].fn
    kw = dict(n_steps=5, step_size=0.01, noise_scale=0.1, seed=1, offset=0)
    ref = f(xg, mg, pg, **kw)
    close(ref, run.host.kernels["gaussian_langevin_chain"].fn(x, m, p, **kw), 1e-4, "contiguous vs host")
    wide = torch.zeros(run.sizes.n, 13, device=run.dev)
    wide[:, 3:9] = xg
    close(f(wide[:, 3:9], mg, pg, **kw), ref, 0, "column slice")
    close(f(xg.t().contiguous().t(), mg, pg, **kw), ref, 0, "transposed storage")
    close(f(torch.cat([xg[:1], xg])[1:], mg, pg, **kw), ref, 0, "storage offset")
    close(f(xg, mg.expand(6), pg.t(), **kw), ref, 0, "parameters non-contiguous")
    close(f(xg[:1], mg, pg, **kw), ref[:1], 0, "one chain")
    e = run.gpu.kernels["gaussian_energy"].fn(xg[::3], mg, pg)
    close(e, run.gpu.kernels["gaussian_energy"].fn(xg[::3].contiguous(), mg, pg), 0, "strided rows")


# 4. the caller's current stream: a side stream busy before it writes x; the kernel must wait for it
def streams(run: Run) -> str | None:
    from ebmcore.kernels.ops import sample_inputs

    if run.no_gpu or run.sanitizer:
        return "skipped: needs a GPU (no side streams on the CPU)" if run.no_gpu else "skipped: not under the sanitizer"
    x, m, p = [t.cuda() for t in sample_inputs("gaussian_energy", 200_000, 10, dtype=torch.float32)]
    want = run.gpu.kernels["gaussian_energy"].fn(torch.ones_like(x), m, p)
    kw = dict(n_steps=3, step_size=0.01, noise_scale=0.0, seed=0, offset=0)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        y = torch.zeros_like(x)
        torch.cuda._sleep(200_000_000)  # ~0.1 s of spinning on s
        y.fill_(1.0)
        got = run.gpu.kernels["gaussian_energy"].fn(y, m, p)  # launched on s: must see the ones
        chain = run.gpu.kernels["gaussian_langevin_chain"].fn(y, m, p, **kw)
    torch.cuda.current_stream().wait_stream(s)
    close(got, want, 0, "energy on a busy side stream")
    close(chain, run.gpu.kernels["gaussian_langevin_chain"].fn(torch.ones_like(x), m, p, **kw), 0, "chain on a side stream")


# 5. CUDA-graph capture of the chain and step kernels, replayed
def graphs(run: Run) -> str | None:
    from ebm_cuda import dispatch
    from ebmcore.kernels.ops import sample_inputs

    if run.no_gpu or run.sanitizer:
        return "skipped: needs a GPU (torch.cuda.CUDAGraph)" if run.no_gpu else "skipped: not under the sanitizer"
    x, m, p = [t.cuda() for t in sample_inputs("gaussian_energy", 4099, 10, dtype=torch.float32)]
    g = torch.randn_like(x)
    kw = dict(n_steps=4, step_size=0.01, noise_scale=0.1, seed=3, offset=0)
    xs = x.clone()
    f, step = run.gpu.kernels["gaussian_langevin_chain"].fn, run.gpu.kernels["langevin_step_philox"].fn
    f(xs, m, p, **kw), step(xs, g, 0.01, 0.1, 5, 1)  # warm-up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    sync, dispatch._SYNC = dispatch._SYNC, False  # EBM_CUDA_SYNC=1 would synchronize inside the capture
    try:
        with torch.cuda.graph(graph):
            out = f(xs, m, p, **kw)
            out2 = step(out, g, 0.01, 0.1, 5, 1)
    finally:
        dispatch._SYNC = sync
    graph.replay()
    torch.cuda.synchronize()
    want = f(x, m, p, **kw)
    close(out, want, 0, "chain, graph replay")
    close(out2, step(want, g, 0.01, 0.1, 5, 1), 0, "step, graph replay")
    xs.copy_(x + 1)  # replay reads the captured input buffer anew
    graph.replay()
    torch.cuda.synchronize()
    close(out, f(x + 1, m, p, **kw), 0, "chain, second replay on new inputs")


# 6. one launch over 2^24 + 3 chains (65,537 blocks of 256 for the step kernel), against the host build
def big(run: Run) -> str | None:
    from ebm_cuda.testing import assert_chains_close

    if run.sizes.big == 0:
        return "skipped: not under the sanitizer"
    n, d, h = run.sizes.big, 2, 0.01
    x = torch.randn(n, d, generator=torch.Generator().manual_seed(7))
    kw = dict(n_steps=5, step_size=h, noise_scale=math.sqrt(2 * h), seed=11, offset=2**32 - 2)
    got = run.gpu.kernels["double_well_langevin_chain"].fn(x.to(run.dev), 1.0, **kw)
    assert_chains_close(
        got,
        run.host.kernels["double_well_langevin_chain"].fn(x, 1.0, **kw),
        rtol=1e-4,
        atol=1e-4,
        what=f"double_well_langevin_chain, {n} chains",
    )
    grad = 0.1 * x
    got = run.gpu.kernels["langevin_step_philox"].fn(x.to(run.dev), grad.to(run.dev), h, 0.1, 3, 9)
    close(got, run.host.kernels["langevin_step_philox"].fn(x, grad, h, 0.1, 3, 9), 1e-5, f"langevin_step_philox, {n} chains")


# 7. refusals: d = 65 and float64 are errors, not launches (emulated: the .cu file's own refusals, on the CPU)
def refusals(run: Run) -> str | None:
    from ebm_cuda import analytic_ops, library
    from ebmcore.errors import InputError

    if run.dry:
        return "skipped: the host build takes d = 65 and float64"

    refused = library.KernelError if run.emulated else InputError
    for x in (torch.zeros(4, 65, device=run.dev), torch.zeros(4, 3, device=run.dev, dtype=torch.float64)):
        try:
            with run.on_gpu():
                analytic_ops.langevin_chain(x, 1, None, None, 1.0, 0.0, 1, 0.1, 0.1, None, None, 0, 0)
        except refused:
            continue
        raise AssertionError(f"a {tuple(x.shape)} {x.dtype} state was not refused")


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    sizes = SIZES[args.sizes or ("dry" if args.dry else "memcheck" if args.emulated else "full")]
    no_gpu = args.dry or bool(args.emulated)
    from ebm_cuda import analytic_ops, library, testing
    from ebm_cuda.backends import CudaBackend, HostBackend

    checks = Checks("cpu" if no_gpu else "cuda", args.json)
    emulated = _recorded(args.emulated) if args.emulated else None
    on_gpu = (lambda: testing.cuda_emulation(emulated)) if emulated else contextlib.nullcontext
    if not no_gpu:

        def load() -> None:
            why = library.cuda_unavailable_reason()
            if why is not None:
                raise RuntimeError(why)

        checks.run("the CUDA kernels load", load)
        if checks.results[-1]["status"] == "failed":
            return finish(checks)
    run = Run(
        sizes,
        Side(HostBackend(), on_gpu) if no_gpu else CudaBackend(),
        HostBackend(),
        "cpu" if no_gpu else "cuda",
        on_gpu,
        no_gpu,
        args.sizes in ("memcheck", "racecheck") or bool(args.emulated),
        args.dry,
        args.emulated,
    )
    for name in analytic_ops.KINDS:
        for dtype in sizes.dtypes:
            checks.run(
                f"{name} {str(dtype).removeprefix('torch.')}: energy, gradient, langevin, hmc, nuts vs host, d in {list(sizes.dims)}",
                lambda name=name, dtype=dtype: energy_checks(run, name, dtype),
            )
    checks.run("langevin_step_philox, langevin_step, normal, philox vs host", lambda: steps(run))
    checks.run("non-contiguous, offset and single-chain inputs equal the contiguous run", lambda: layouts(run))
    checks.run("launches go to the caller's current stream (a busy side stream)", lambda: streams(run))
    checks.run("CUDA-graph capture and replay of a chain and a step kernel", lambda: graphs(run))
    checks.run(f"a 2^24-chain launch ({'here ' if args.dry else ''}{sizes.big:,} chains) equals the host build", lambda: big(run))
    checks.run("refusals: d = 65 and float64 on the GPU", lambda: refusals(run))
    if emulated:
        print("emulated entry points run:", " ".join(sorted(emulated.ran)))
    return finish(checks)


def finish(checks: Checks) -> int:
    return 1 if any(r["status"] == "failed" for r in checks.results) else 0


if __name__ == "__main__":
    sys.exit(main())
