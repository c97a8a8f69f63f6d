#!/usr/bin/env python
"""One-command device check (``make gpu-check``): on a bare machine with an NVIDIA GPU and a carried CUDA build cache,
in 9 minutes (``--budget 540``; a device machine allows 10 a command), in this order:

1. the environment: device, driver, torch/CUDA/nvcc/Triton versions;
2. the builds, timed: the host library and the CUDA library for this GPU (nvcc);
3. ``gpu_check_kernels.py``: every ``.cu`` entry point and dtype on CUDA against the host build (non-contiguous and
   offset inputs, the caller's stream, CUDA-graph capture, a 2^24-chain launch, refusals);
4. ``compute-sanitizer`` memcheck, racecheck, synccheck and initcheck over those entry points at small odd sizes
   (:data:`SANITIZERS`), where the tool exists;
5. the GPU tests (``test_cuda_device.py``, ``test_plugin.py``, the Triton chains' GPU tests, the captured graphs'
   ``test_graphs.py``), each file in its own process and time limit, with ``CUDA_LAUNCH_BLOCKING=1``; a skip there
   fails;
6. docs/distributed.md's example under ``torchrun`` with two processes: with gloo, and with NCCL where there are two
   GPUs (NCCL refuses two ranks on one GPU: skipped there, saying so);
7. ``benchmarks/gpu.py`` at full size, one process per group, S, G3, T, G1 (``--workloads`` chooses), each row with
   its correctness check (and G1's fused chain against its one-step calls, G3's eager runs against the compiled
   ones): the tables in ``<results>-<group>.md`` and the raw figures in ``<results>-<group>.json``.

The order puts the most useful results first where time runs short. Times from the H100 run at b11eeb6
(``results/2026-11-27-h100-b11eeb6/``: ``check.json``, ``T.md``, ``G3S.md``; the CUDA build carried, 4 s each):

- checks before figures: a figure of broken kernels is worth nothing;
- the kernels (each check under 0.2 s, the 2^24 launch 1.6 s) and the sanitizers (memcheck 7.5 s, racecheck 13 s)
  are short, bounded and decisive (racecheck reported hazards there), so they come before the GPU tests, where
  one file that hangs costs its whole limit (``test_plugin.py``: 90 s there; the files took 144 s in all);
- the distributed example: two processes, seconds;
- S (15 s) and G3 (28 s): the cheapest groups and the headline figures (the guides' figures; W4/W5 at scale,
  eager, compiled, ebm's default and fused paths, torchebm), which gpu.py saves only when the group ends: they go
  where time is surest;
- T (132 s): the Triton launch sweep, the longest group; it saves each row as it is measured, so cut short it keeps
  what it measured (its table is then made from the ``.json``);
- G1 (32 s of tables on the H200, ``results/2026-11-26-gpu-h200.md``): measured on a GPU before, the least new; it
  prints each energy's table as it finishes.

Every step runs in its own process with its own time limit (:data:`WORKLOADS` caps each group, so that none eats
the budget), cut to what is left of ``--budget``. Writes ONE results file (``--out``): the device and versions, for
each check passed/failed/skipped with the reason and its time, and each group's raw results. Exit status 1 if a
check failed.

``--dry`` runs the same steps on the CPU, the host build against the host build at tiny sizes, the groups with
``--device cpu --quick``, the distributed example with gloo (the GPU-only checks skipped, saying why): what CI runs
so this script cannot rot.

    python benchmarks/gpu_check.py [--dry] [--out PATH] [--budget SECONDS] [--workloads S,G3,T,G1|none]
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, NamedTuple

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
GPU_TESTS = [  # (pytest target, its time limit in seconds)
    ("plugins/ebm_cuda/tests/test_cuda_device.py", 120),
    ("plugins/ebm_cuda/tests/test_plugin.py", 90),
    (
        "plugins/ebm_cuda/tests/test_triton_chains.py::test_on_a_gpu_the_compiled_chain_equals_the_host_build_and_samplers_resolve_it",
        150,
    ),
    (
        "plugins/ebm_cuda/tests/test_triton_contrastive.py::test_on_a_gpu_the_compiled_contrastive_chain_equals_the_chain_and_the_host_build",
        150,
    ),
    ("plugins/ebm_samplers/tests/test_graphs.py", 90),
]
SAME_NOISE_TOL = 1e-3  # G3 eager vs compiled: float rounding, not different noise (that differs by O(1))
SANITIZERS = (  # (tool, gpu_check_kernels.py --sizes, time limit in s); the H100 at b11eeb6: memcheck 7.5 s, racecheck 13 s
    ("memcheck", "memcheck", 60),
    ("racecheck", "racecheck", 90),
    ("synccheck", "memcheck", 60),  # barriers: every chain-size class, partial blocks
    ("initcheck", "memcheck", 90),  # reads of unwritten global memory: every entry point's outputs and workspaces
)


class Group(NamedTuple):
    """A group of ``benchmarks/gpu.py`` in the check: its time limit and timed runs per row."""

    name: str
    cap: float
    repeats: int


WORKLOADS = (Group("S", 90, 5), Group("G3", 120, 5), Group("T", 240, 3), Group("G1", 150, 3))
"""The default groups, in the order they run (the module docstring says why), each capped well above its time on the
H100 (T: 132 s, G3: 28 s, S: 15 s, each plus a process start of seconds; G1: 32 s of tables on the H200)."""
OTHER_GROUP = Group("G2", 300, 3)  # a group named with --workloads beyond these (G2: G1 twice, in 16-bit state)


class Report:
    """The checks so far, printed one line each as they finish."""

    def __init__(self) -> None:
        self.checks: list[dict] = []

    def add(self, name: str, status: str, reason: str = "", seconds: float = 0.0, **details: Any) -> None:
        assert status in ("passed", "failed", "skipped"), status
        self.checks.append({"name": name, "status": status, "reason": reason, "seconds": round(seconds, 2), **details})
        print(f"{status.upper():7s} {name}" + (f": {reason}" if reason else "") + f" [{seconds:.1f} s]", flush=True)

    def count(self, status: str) -> int:
        return sum(c["status"] == status for c in self.checks)


class Clock:
    """The overall budget: each step's time limit is its own cap, cut to what is left (less a reserve)."""

    def __init__(self, budget: float) -> None:
        self.start, self.budget = time.monotonic(), budget

    def left(self) -> float:
        return self.budget - (time.monotonic() - self.start)

    def limit(self, cap: float) -> float:
        return max(0.0, min(cap, self.left() - 5.0))


def run(command: list[str], timeout: float, env: dict | None = None, keep: int = 6000) -> tuple[int | None, str, float]:
    """``(exit status or None on timeout, the output's last ``keep`` characters, seconds)``; a timed-out command is
    killed with its process group."""
    t0 = time.monotonic()
    if timeout <= 0:
        return None, NOT_STARTED, 0.0
    proc = subprocess.Popen(
        command,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, **(env or {})},
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
        rc: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        rc = None
        out = (out or "") + f"\n[killed after {timeout:.0f} s]"
    return rc, (out or "")[-keep:], time.monotonic() - t0


NOT_STARTED = "not run: no time left in the budget"


def failure(rc: int | None, out: str) -> str:
    """Why a step's process failed: its exit status, a timeout, or no time left to start it."""
    if rc is None:
        return NOT_STARTED if out == NOT_STARTED else "timed out"
    return f"exit {rc}" + (" (the sanitizer reported errors)" if rc == 9 else "")


def tail(text: str, lines: int = 12) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def verdict(
    report: Report, name: str, rc: int | None, out: str, secs: float, passed: str, wrong: str = "", detail: str = ""
) -> bool:
    """Report a step's process: passed, saying ``passed``, where it exited 0 and ``wrong`` (what its output shows
    wrong) is empty; else failed, saying why, with ``detail`` and the output's tail."""
    if rc == 0 and not wrong:
        report.add(name, "passed", passed, secs)
        return True
    why = "; ".join(x for x in (failure(rc, out) if rc != 0 else "", wrong) if x)
    report.add(name, "failed", why, secs, output=(detail + "\n" if detail else "") + tail(out, 40))
    return False


def load_json(path: Path) -> Any:
    """``path``'s JSON, or None where it is missing or cut off mid-write (its process killed at its limit)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def bench_module(name: str) -> ModuleType:
    """``benchmarks/<name>.py``, imported from its file."""
    spec = importlib.util.spec_from_file_location(f"ebm_benchmarks_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look the module up while the class is built
    spec.loader.exec_module(module)
    return module


def tool_version(command: list[str], line: str = "") -> str | None:
    """The first line of ``command``'s output that contains ``line`` (default: the first line), or None."""
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return next((x.strip() for x in out.splitlines() if line in x), None)


def find_sanitizer() -> str | None:
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    from ebm_cuda import build

    nvcc = build.find_nvcc()
    if nvcc:
        homes.append(str(Path(nvcc).resolve().parents[1]))
    for home in filter(None, homes):
        for sub in ("bin", "compute-sanitizer"):
            path = Path(home) / sub / "compute-sanitizer"
            if path.exists():
                return str(path)
    return None


# ----------------------------------------------------------------------------------------------
# Steps
# ----------------------------------------------------------------------------------------------


def environment(dry: bool) -> dict:
    import torch

    from ebm_cuda import build

    env: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "nvcc": tool_version([build.find_nvcc() or "nvcc", "--version"], "release"),
        "cxx": tool_version([build.find_cxx() or "c++", "--version"]),
        "compute_sanitizer": find_sanitizer(),
        "machine": platform.machine(),
    }
    try:
        import triton

        env["triton"] = triton.__version__
    except Exception as exc:  # noqa: BLE001
        env["triton"] = f"not importable ({type(exc).__name__})"
    try:
        env["git_commit"] = (
            subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=30).stdout.strip()
            or None
        )
    except (OSError, subprocess.SubprocessError):
        env["git_commit"] = None
    device: dict[str, Any] = {"type": "cpu" if dry else "cuda"}
    if not dry:  # what the driver sees, even where torch sees no device
        smi = tool_version(["nvidia-smi", "--query-gpu=name,driver_version,compute_cap,memory.total", "--format=csv,noheader"])
        device["nvidia_smi"] = smi
        device["driver"] = smi.split(", ")[1] if smi and smi.count(", ") >= 1 else None
    if not dry and torch.version.cuda is not None and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        device.update(
            name=torch.cuda.get_device_name(0),
            compute_capability="{}.{}".format(*torch.cuda.get_device_capability(0)),
            memory_GiB=round(props.total_memory / 2**30, 1),
            count=torch.cuda.device_count(),
        )
    elif dry:
        device["name"] = f"cpu ({platform.processor() or platform.machine()}, dry run)"
    return {"device": device, "versions": env}


def step_environment(report: Report, meta: dict, dry: bool) -> bool:
    """The device and versions (in ``meta``); False where there is no GPU (and not a dry run)."""
    t0 = time.monotonic()
    dev = meta["device"]
    if dry:
        report.add("environment", "passed", "dry run on the CPU: the host build stands in for the GPU", time.monotonic() - t0)
        return True
    from ebm_cuda.testing import gpu_absent_reason

    absent = gpu_absent_reason()
    if absent:
        report.add("environment", "failed", absent, time.monotonic() - t0)
        return False
    report.add(
        "environment",
        "passed",
        f"{dev['name']} (sm_{dev['compute_capability'].replace('.', '')}), driver {dev.get('driver')}",
        time.monotonic() - t0,
    )
    return True


BUILD = """
import sys, time, torch
from ebm_cuda import build
what = sys.argv[1]
t0 = time.perf_counter()
if what == "host":
    path = build.build_host()
else:
    path = build.build_cuda(["{}{}".format(*torch.cuda.get_device_capability())])
import pathlib
print(f"built {str(path).replace(str(pathlib.Path.home()), '~', 1)} in {time.perf_counter() - t0:.1f} s")
"""


def step_build(report: Report, clock: Clock, py: str, dry: bool) -> bool:
    """The host library and the CUDA library for this GPU, each timed in its own process; False if one failed."""
    ok = True
    for what, cap in (("host", 120), ("cuda", 300)):
        name = "build: the host library (c++)" if what == "host" else "build: the CUDA library for this GPU (nvcc)"
        if what == "cuda" and dry:
            report.add(name, "skipped", "dry run: no GPU (tests/test_nvcc_build.py compiles kernels.cu for sm_80/sm_90 in CI)")
            continue
        rc, out, secs = run([py, "-c", BUILD, what], clock.limit(cap))
        ok = verdict(report, name, rc, out, secs, tail(out, 1)) and ok
    return ok


def step_tests(report: Report, clock: Clock, py: str, dry: bool, work: Path) -> None:
    """Each GPU test file in its own pytest process with its own time limit (on the first GPU machine one slow test
    cut off the whole run, and with it every other file's results), ``faulthandler_timeout`` dumping the stacks of a
    test that runs past 60 s, the slowest tests in the check's output."""
    try:
        import pytest  # noqa: F401
    except ImportError:
        report.add("GPU tests", "failed", "pytest is not installed")
        return
    note, extra = "", []
    try:
        import hypothesis  # noqa: F401  (the repository's conftest.py imports it)
    except ImportError:
        extra = ["--noconftest", "-p", "ebmcore.testing.fixtures"]
        note = " (hypothesis missing: without the repository's conftest.py)"
    for target, cap in GPU_TESTS:
        label = Path(target.split("::")[0]).name + (" (its GPU test)" if "::" in target else "")
        name = f"GPU tests: {label}, CUDA_LAUNCH_BLOCKING=1"
        junit = work / f"gpu-tests-{label.split('.')[0]}.xml"
        command = [
            py,
            "-m",
            "pytest",
            "-q",
            "-rs",
            *extra,
            "--durations=5",
            "-o",
            "faulthandler_timeout=60",
            "-p",
            "no:cacheprovider",
            f"--junitxml={junit}",
            target,
        ]
        rc, out, secs = run(command, clock.limit(cap), env={"CUDA_LAUNCH_BLOCKING": "1"})
        counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
        if junit.exists():
            suite = ET.parse(junit).getroot()
            suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
            counts = {k: int(suite.get(k, 0)) for k in counts}
        passed = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
        summary = f"{passed} passed, {counts['failures']} failed, {counts['errors']} errors, {counts['skipped']} skipped{note}"
        allowed_skips = 1 if label == "test_plugin.py" else 0  # its no-CUDA test skips on a GPU
        if rc is None:
            report.add(name, "failed", f"{failure(rc, out)} ({summary})", secs, output=tail(out, 80))
        elif rc != 0:
            report.add(name, "failed", summary, secs, output=tail(out, 80))
        elif not dry and counts["skipped"] > allowed_skips:
            report.add(name, "failed", f"tests skipped on a GPU: {summary}", secs, output=tail(out, 30))
        else:
            report.add(name, "passed", summary, secs, output=tail(out, 10))  # the slowest tests among them


def step_kernels(
    report: Report,
    clock: Clock,
    py: str,
    dry: bool,
    work: Path,
    sizes: str | None = None,
    sanitizer: list[str] | None = None,
    label: str = "kernels",
    cap: float = 150,
) -> None:
    """gpu_check_kernels.py: one check per line it reports; under ``sanitizer`` (a command prefix), one check
    ``compute-sanitizer <label>`` that passes where the sanitizer and every kernel check do."""
    out_json = work / f"{label}.json"
    command = [py, str(BENCH / "gpu_check_kernels.py"), "--json", str(out_json)]
    command += ["--dry"] if dry else []
    command += ["--sizes", sizes] if sizes else []
    env = {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"} if sanitizer else None  # one cudaMalloc per tensor: exact bounds
    rc, out, secs = run([*(sanitizer or []), *command], clock.limit(cap), env=env)
    results = load_json(out_json) or []
    if sanitizer:
        failed = [r["name"] for r in results if r["status"] == "failed"]
        errors = [
            line
            for line in out.splitlines()
            if line.startswith("========") and ("ERROR SUMMARY" in line or "Error" in line or "Hazard" in line)
        ]
        if rc == 0 and results and not failed:
            report.add(f"compute-sanitizer {label}", "passed", f"{len(results)} kernel checks, {tail(out, 1)}", secs)
        else:
            report.add(
                f"compute-sanitizer {label}",
                "failed",
                failure(rc, out) + (f"; checks failed: {failed}" if failed else ""),
                secs,
                output="\n".join(errors[:20]) + "\n" + tail(out, 40),
            )
        return
    for r in results:
        report.add(f"kernels: {r['name']}", r["status"], r["reason"], r["seconds"])
    if rc != 0 and not any(r["status"] == "failed" for r in results):  # crashed, or timed out, between checks
        report.add("kernels: the process", "failed", failure(rc, out), secs, output=tail(out, 40))


def step_sanitizer(report: Report, clock: Clock, py: str, dry: bool, work: Path) -> None:
    """``compute-sanitizer``'s tools over the kernel checks, each at its sizes and in its time limit
    (:data:`SANITIZERS`); skipped, saying why, in a dry run and where the tool is not found."""
    tool = None if dry else find_sanitizer()
    for kind, sizes, cap in SANITIZERS:
        if tool is None:
            report.add(
                f"compute-sanitizer {kind}",
                "skipped",
                "dry run: no GPU" if dry else "compute-sanitizer not found (PATH, $CUDA_HOME/bin, /usr/local/cuda)",
            )
            continue
        sanitizer = [tool, "--tool", kind, "--error-exitcode", "9", "--print-limit", "20", "--target-processes", "all"]
        step_kernels(report, clock, py, dry, work, sizes=sizes, sanitizer=sanitizer, label=kind, cap=cap)


DIST_DOC = ROOT / "docs" / "distributed.md"
SAMPLES_LINE = re.compile(r"^torch\.Size\(\[(\d+), (\d+)\]\) tensor\(([\d.]+)[^)]*\) [\d.]+$", re.M)  # what rank 0 prints


def step_distributed(report: Report, clock: Clock, py: str, dry: bool, work: Path, gpus: int) -> None:
    """docs/distributed.md's example (its Python block that calls ``distributed.init()``) under ``torchrun`` with two
    processes: with gloo (``EBM_DIST_BACKEND=gloo``: its device is then the CPU), and with NCCL (``cuda:LOCAL_RANK``)
    where there are two GPUs. Rank 0 alone prints: one line, the samples of both ranks' chains gathered (the shape the
    page's comment shows), R-hat at most 1.1."""
    name = "distributed: docs/distributed.md's example, torchrun with 2 processes"
    blocks = re.findall(r"```python\n(.*?)```", DIST_DOC.read_text(), re.S)
    code = next((b for b in blocks if "distributed.init(" in b), None)
    if code is None:
        report.add(name, "failed", "docs/distributed.md has no Python example that calls distributed.init()")
        return
    script = work / "distributed_example.py"
    script.write_text(code)
    shown = re.search(r"# \((\d+), (\d+)\)", code)
    for backend in ("gloo", "nccl"):
        if backend == "nccl" and gpus < 2:
            report.add(
                f"{name}, nccl",
                "skipped",
                "dry run: no GPU"
                if dry
                else f"{gpus} GPU here: NCCL refuses two ranks "
                "on one GPU (\"Duplicate GPU detected\"); the example ran with gloo",
            )
            continue
        command = [py, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script)]
        rc, out, secs = run(command, clock.limit(60), env={"EBM_DIST_BACKEND": backend, "OMP_NUM_THREADS": "1"})
        printed = SAMPLES_LINE.findall(out)
        wrong = f"rank 0 alone should print one line of samples; {len(printed)} printed" if len(printed) != 1 else ""
        if not wrong and shown and printed[0][:2] != shown.groups():
            wrong = f"samples of shape ({', '.join(printed[0][:2])}), not the ({', '.join(shown.groups())}) the page shows"
        if not wrong and float(printed[0][2]) > 1.1:
            wrong = f"R-hat {printed[0][2]} > 1.1"
        line = next((x for x in out.splitlines() if SAMPLES_LINE.match(x)), "")
        verdict(report, f"{name}, {backend}", rc, out, secs, f"rank 0 printed: {line}", wrong)


def check_g1(report: Report, data: dict) -> None:
    """G1: each energy's fused chain (c) equals its one-step calls (d), which draw the same Philox stream, and no row's
    moments are off the ULA law."""
    name = "workloads G1: the fused chain equals its one-step calls, moments within 5 sigma"
    rows = {(r["energy"], r["key"]): r for r in data["analytic"] if r["group"] == "G1"}
    diffs = {
        e: r["figures"].get("max_abs_diff_vs_c")
        for (e, k), r in rows.items()
        if k == "d" and r.get("timing") and rows.get((e, "c"), {}).get("timing")
    }
    if not diffs:
        why = "; ".join(f"{e} ({k}): {r.get('skipped')}" for (e, k), r in rows.items() if k in ("c", "d"))
        report.add(name, "failed", f"rows (c)/(d) did not run: {why}")
        return
    worst = max((float("inf") if v is None else v) for v in diffs.values())
    bad = [f"{e} ({k})" for (e, k), r in rows.items() if r.get("timing") and r["figures"].get("moments_ok") is False]
    report.add(
        name,
        "passed" if worst <= 1e-5 and not bad else "failed",
        f"max abs diff (c) vs (d) {worst:.1e} over {', '.join(diffs)}" + (f"; moments off in {', '.join(bad)}" if bad else ""),
    )


def check_g3(report: Report, data: dict) -> None:
    """G3: the compiled per-step loop draws the eager loop's noise, so its W4 states and W5 loss and gradient equal the
    eager loop's to rounding; the conv PCD step's captured graph gives the per-step loop's first loss and gradient."""
    rows = {(r["workload"], r["variant"]): r for r in data["g3"]}
    name = "workloads G3: eager vs compiled, same noise (W4 states, W5 loss and gradient)"
    w4, w5 = rows.get(("W4x100", "compile"), {}), rows.get(("W5x100", "compile"), {})
    f4, f5 = w4.get("figures", {}), w5.get("figures", {})
    if "max_abs_diff_vs_eager" not in f4 or "grad_rel_diff_vs_eager" not in f5:
        why = "; ".join(str(r.get("skipped", "no row")) for r in (w4, w5))
        report.add(name, "failed", f"the compiled rows did not run: {why}")
    else:
        diff, rel = f4["max_abs_diff_vs_eager"], max(f5["loss_rel_diff_vs_eager"], f5["grad_rel_diff_vs_eager"])
        report.add(
            name,
            "passed" if max(diff, rel) <= SAME_NOISE_TOL else "failed",
            f"W4 max abs diff {diff:.1e}, W5 largest relative difference {rel:.1e} (limit {SAME_NOISE_TOL:g})",
        )
    conv = rows.get(("ConvPCD", "default"), {})
    name = "workloads G3: conv PCD step, captured graph vs per-step loop"
    if "figures" not in conv:
        report.add(name, "failed", f"the default conv PCD row did not run: {conv.get('skipped', 'no row')}")
    elif not str(conv.get("path")).startswith("CUDA graph"):
        report.add(name, "skipped", f"the default path is not a captured graph here: {conv.get('path')}")
    else:
        rel = max(conv["figures"]["loss_rel_diff_vs_eager"], conv["figures"]["grad_rel_diff_vs_eager"])
        report.add(
            name,
            "passed" if rel <= SAME_NOISE_TOL else "failed",
            f"the same draws: first step's loss and gradient, largest relative difference {rel:.1e} (limit {SAME_NOISE_TOL:g})",
        )


GROUP_CHECKS: dict[str, Callable[[Report, dict], None]] = {"G1": check_g1, "G3": check_g3}
ROW_LISTS = ("analytic", "step_kernels", "g3", "seeds", "triton")  # gpu.py's rows in its .json


def unprinted_tables(group: str, text: str, data: dict | None) -> str:
    """Of a group cut off by its time limit, the tables its output lacks, made from the rows its ``.json`` kept. Only T
    needs it: it saves each row as it is measured but prints its table at its end; G1 prints each energy's table as it
    finishes, and G3 and S save nothing before their end (their progress lines are in the ``.md``)."""
    rows = (data or {}).get("triton") or []
    if group != "T" or not rows or "## T:" in text:
        return ""
    table = bench_module("triton_sweep").sweep_table(rows, bench_module("run").Z_TOL)
    return f"\n\n## T, cut off by its time limit: the {len(rows)} rows measured (from the .json)\n\n{table}\n"


def step_workloads(report: Report, clock: Clock, py: str, dry: bool, out: Path, groups: list[str]) -> dict[str, Any]:
    """``benchmarks/gpu.py`` at full size for ``groups``, one process per group in the order given, each in its cap
    (:data:`WORKLOADS`) cut to what is left of the budget. Beside the results file, ``<results>-<group>.md`` (the
    tables and progress lines; where the group was cut off, :func:`unprinted_tables` too) and ``.json`` (raw). A row
    that fails its correctness check, or fails to run, fails the group; then the group's :data:`GROUP_CHECKS`. Dry:
    ``--device cpu --quick``, one timed run per row. Returns each group's raw results (None where it saved none)."""
    caps = {g.name: g for g in WORKLOADS}
    results: dict[str, Any] = {}
    out.parent.mkdir(parents=True, exist_ok=True)
    for group in groups:
        _, cap, repeats = caps.get(group, OTHER_GROUP)
        name = f"workloads {group}: gpu.py --groups {group}"
        stem = out.with_name(f"{out.stem}-{group.lower()}")
        raw = stem.with_suffix(".json")
        raw.unlink(missing_ok=True)  # an earlier run's figures are not this run's
        command = [py, str(BENCH / "gpu.py"), "--groups", group, "--repeats", str(1 if dry else repeats), "--json", str(raw)]
        command += ["--device", "cpu", "--quick"] if dry else []
        rc, text, secs = run(command, clock.limit(cap), env={"TORCH_COMPILE_DISABLE": "1"} if dry else None, keep=1_000_000)
        data = results[group] = load_json(raw)
        if text != NOT_STARTED:
            text += unprinted_tables(group, text, data) if rc != 0 else ""
            stem.with_suffix(".md").write_text(text)  # the tables and the progress lines (the raw figures are in .json)
        failed = [line.strip() for line in text.splitlines() if "**FAIL**" in line or "failed:" in line]
        rows = [r for key in ROW_LISTS for r in (data or {}).get(key, [])]
        skipped = sum(bool(r.get("skipped")) for r in rows)
        wrong = f"{len(failed)} rows failed or missed their correctness check" if failed else ""
        verdict(
            report,
            name,
            rc,
            text,
            secs,
            f"{len(rows)} rows ({skipped} skipped), tables in {stem}.md",
            wrong,
            detail="\n".join(failed[:20]),
        )
        if data and group in GROUP_CHECKS:
            GROUP_CHECKS[group](report, data)
    return results


# ----------------------------------------------------------------------------------------------


def bare_site(dest: Path) -> list[Path]:
    """For a machine where pip cannot install the packages: a folder of minimal dist-info folders (name, version,
    entry points, read from each pyproject.toml) that, on ``PYTHONPATH`` beside the sources, lets ebmcore find its
    plugins. Returns the dist-info folders."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib

    made = []
    for pyproject in [ROOT / "pyproject.toml", *sorted(ROOT.glob("plugins/*/pyproject.toml"))]:
        project = tomllib.loads(pyproject.read_text())["project"]
        info = dest / f"{project['name'].replace('-', '_')}-{project['version']}.dist-info"
        info.mkdir(parents=True, exist_ok=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
        groups = project.get("entry-points", {})
        (info / "entry_points.txt").write_text(
            "".join(
                f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in entries.items()) + "\n" for group, entries in groups.items()
            )
        )
        made.append(info)
    return made


def default_out(dry: bool) -> Path:
    if os.environ.get("GPU_CHECK_OUT"):
        return Path(os.environ["GPU_CHECK_OUT"])
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d-%H%M")
    if os.environ.get("OUT"):  # a device machine's folder that comes back
        return Path(os.environ["OUT"]) / f"gpu-check-{stamp}.json"
    if dry:
        return Path(tempfile.gettempdir()) / "ebm-gpu-check-dry.json"
    return BENCH / "results" / f"gpu-check-{stamp}.json"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dry", action="store_true", help="on the CPU: the host build against itself, tiny sizes")
    ap.add_argument(
        "--out",
        type=Path,
        help="the results file (default: $GPU_CHECK_OUT, else $OUT/gpu-check-<date>.json, "
        "else benchmarks/results/gpu-check-<date>.json; dry: in the temp folder)",
    )
    ap.add_argument("--budget", type=float, default=540.0, help="seconds for all steps (default 540: 9 minutes)")
    ap.add_argument(
        "--workloads",
        default=",".join(g.name for g in WORKLOADS),
        metavar="GROUPS",
        help="gpu.py's groups to run after the checks, in this order (default: %(default)s; none: no group)",
    )
    ap.add_argument("--bare-site", type=Path, metavar="DIR", help=argparse.SUPPRESS)  # gpu_check.sh's fallback: see bare_site
    args = ap.parse_args(argv)
    if args.bare_site:
        for info in bare_site(args.bare_site):
            print(info)
        return 0
    groups = [g.strip().upper() for g in args.workloads.split(",") if g.strip() and g.strip().lower() != "none"]
    out = args.out or default_out(args.dry)
    py = sys.executable
    clock = Clock(args.budget)
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    report = Report()
    meta = environment(args.dry)
    print(f"ebm gpu-check{' --dry' if args.dry else ''}: {meta['device'].get('name', 'no GPU')}", flush=True)
    workloads: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="ebm-gpu-check-") as tmp:
        work = Path(tmp)
        if not step_environment(report, meta, args.dry):
            report.add("the other steps", "failed", "not run: no GPU here (on a CPU machine, run the dry mode: --dry)")
            return finish(report, meta, clock, args, out, started, workloads)
        # the order, and why: the module docstring
        if step_build(report, clock, py, args.dry):
            step_kernels(report, clock, py, args.dry, work)
            step_sanitizer(report, clock, py, args.dry, work)
        else:
            report.add("kernels and compute-sanitizer", "failed", "not run: a build failed")
        step_tests(report, clock, py, args.dry, work)
        step_distributed(report, clock, py, args.dry, work, meta["device"].get("count", 0))
        workloads = step_workloads(report, clock, py, args.dry, out, groups)
    return finish(report, meta, clock, args, out, started, workloads)


def finish(
    report: Report, meta: dict, clock: Clock, args: argparse.Namespace, out: Path, started: str, workloads: dict[str, Any]
) -> int:
    """Write the results file (with each group's raw results), print the summary line; the exit status."""
    seconds = time.monotonic() - clock.start
    summary = {
        "passed": report.count("passed"),
        "failed": report.count("failed"),
        "skipped": report.count("skipped"),
        "seconds": round(seconds, 1),
        "budget_s": args.budget,
    }
    result = {
        "tool": "ebm gpu-check",
        "dry": args.dry,
        "started": started,
        **meta,
        "summary": summary,
        "checks": report.checks,
        "workloads": workloads,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(
        f"gpu-check: {summary['passed']} passed, {summary['failed']} failed, {summary['skipped']} skipped in {seconds:.0f} s; "
        f"results: {out}",
        flush=True,
    )
    return 1 if summary["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
