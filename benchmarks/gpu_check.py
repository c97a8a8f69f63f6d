#!/usr/bin/env python
"""One-command device check (``make gpu-check``): on a machine with an NVIDIA GPU, in under 8 minutes,

1. the environment: device, driver, torch/CUDA/nvcc/Triton versions;
2. the builds, timed: the host library and the CUDA library for this GPU (nvcc);
3. the GPU tests (``test_cuda_device.py``, ``test_plugin.py``, the Triton chains' GPU tests, the captured graphs'
   ``test_graphs.py``), each file in its own
   process and time limit, with ``CUDA_LAUNCH_BLOCKING=1``; a skip there fails;
4. ``gpu_check_kernels.py``: every ``.cu`` entry point and dtype on CUDA against the host build (non-contiguous and
   offset inputs, the caller's stream, CUDA-graph capture, a 2^24-chain launch, refusals);
5. a short G1/G3 pass of ``benchmarks/gpu.py`` (``--quick``: every row's code path, not G1-G3 figures), its
   correctness figures checked (G1's fused chain equal to its one-step calls, G3's eager and compiled runs equal);
6. ``compute-sanitizer`` memcheck and racecheck over those entry points at small odd sizes, where the tool exists
   (last: the least predictable in time, they get what is left of the budget).

Every step runs in its own process with its own time limit, cut to what is left of ``--budget``. Writes ONE results
file (``--out``): the device and versions, and for each check passed/failed/skipped with the reason and its time,
the benchmark's raw results included. Exit status 1 if a check failed.

``--dry`` runs the same steps on the CPU, the host build against the host build at tiny sizes (the GPU-only
checks skipped, saying why): what CI runs so this script cannot rot.

    python benchmarks/gpu_check.py [--dry] [--out PATH] [--budget SECONDS]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
GPU_TESTS = [  # (pytest target, its time limit in seconds)
    ("plugins/ebm_cuda/tests/test_cuda_device.py", 120),
    ("plugins/ebm_cuda/tests/test_plugin.py", 90),
    ("plugins/ebm_cuda/tests/test_triton_chains.py::test_on_a_gpu_the_compiled_chain_equals_the_host_build_and_samplers_resolve_it", 150),
    ("plugins/ebm_cuda/tests/test_triton_contrastive.py::test_on_a_gpu_the_compiled_contrastive_chain_equals_the_chain_and_the_host_build", 150),
    ("plugins/ebm_samplers/tests/test_graphs.py", 90),
]
SAME_NOISE_TOL = 1e-3  # G3 eager vs compiled: float rounding, not different noise (that differs by O(1))


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
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, **(env or {})}, start_new_session=True)
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

    env: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__, "torch_cuda": torch.version.cuda,
                           "nvcc": tool_version([build.find_nvcc() or "nvcc", "--version"], "release"),
                           "cxx": tool_version([build.find_cxx() or "c++", "--version"]),
                           "compute_sanitizer": find_sanitizer(), "machine": platform.machine()}
    try:
        import triton

        env["triton"] = triton.__version__
    except Exception as exc:  # noqa: BLE001
        env["triton"] = f"not importable ({type(exc).__name__})"
    try:
        env["git_commit"] = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                                           timeout=30).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        env["git_commit"] = None
    device: dict[str, Any] = {"type": "cpu" if dry else "cuda"}
    if not dry:  # what the driver sees, even where torch sees no device
        smi = tool_version(["nvidia-smi", "--query-gpu=name,driver_version,compute_cap,memory.total", "--format=csv,noheader"])
        device["nvidia_smi"] = smi
        device["driver"] = smi.split(", ")[1] if smi and smi.count(", ") >= 1 else None
    if not dry and torch.version.cuda is not None and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        device.update(name=torch.cuda.get_device_name(0), compute_capability="{}.{}".format(*torch.cuda.get_device_capability(0)),
                      memory_GiB=round(props.total_memory / 2**30, 1), count=torch.cuda.device_count())
    elif dry:
        device["name"] = f"cpu ({platform.processor() or platform.machine()}, dry run)"
    return {"device": device, "versions": env}


def step_environment(report: Report, meta: dict, dry: bool) -> bool:
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
    report.add("environment", "passed", f"{dev['name']} (sm_{dev['compute_capability'].replace('.', '')}), driver {dev.get('driver')}",
               time.monotonic() - t0)
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
    ok = True
    for what, cap in (("host", 120), ("cuda", 300)):
        name = "build: the host library (c++)" if what == "host" else "build: the CUDA library for this GPU (nvcc)"
        if what == "cuda" and dry:
            report.add(name, "skipped", "dry run: no GPU (tests/test_nvcc_build.py compiles kernels.cu for sm_80/sm_90 in CI)")
            continue
        rc, out, secs = run([py, "-c", BUILD, what], clock.limit(cap))
        if rc == 0:
            report.add(name, "passed", tail(out, 1), secs)
        else:
            ok = False
            report.add(name, "failed", failure(rc, out), secs, output=tail(out, 40))
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
        command = [py, "-m", "pytest", "-q", "-rs", *extra, "--durations=5", "-o", "faulthandler_timeout=60",
                   "-p", "no:cacheprovider", f"--junitxml={junit}", target]
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


def step_kernels(report: Report, clock: Clock, py: str, dry: bool, work: Path, sizes: str | None = None,
                 sanitizer: list[str] | None = None, label: str = "kernels", cap: float = 150) -> None:
    """gpu_check_kernels.py: one check per line it reports; under ``sanitizer`` (a command prefix), one check
    ``compute-sanitizer <label>`` that passes where the sanitizer and every kernel check do."""
    out_json = work / f"{label}.json"
    command = [py, str(BENCH / "gpu_check_kernels.py"), "--json", str(out_json)]
    command += ["--dry"] if dry else []
    command += ["--sizes", sizes] if sizes else []
    env = {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"} if sanitizer else None  # one cudaMalloc per tensor: exact bounds
    rc, out, secs = run([*(sanitizer or []), *command], clock.limit(cap), env=env)
    results = json.loads(out_json.read_text()) if out_json.exists() else []
    if sanitizer:
        failed = [r["name"] for r in results if r["status"] == "failed"]
        errors = [line for line in out.splitlines() if line.startswith("========") and ("ERROR SUMMARY" in line or "Error" in line
                                                                                        or "Hazard" in line)]
        if rc == 0 and results and not failed:
            report.add(f"compute-sanitizer {label}", "passed", f"{len(results)} kernel checks, {tail(out, 1)}", secs)
        else:
            report.add(f"compute-sanitizer {label}", "failed", failure(rc, out) + (f"; checks failed: {failed}" if failed else ""), secs,
                       output="\n".join(errors[:20]) + "\n" + tail(out, 40))
        return
    for r in results:
        report.add(f"kernels: {r['name']}", r["status"], r["reason"], r["seconds"])
    if rc != 0 and not any(r["status"] == "failed" for r in results):  # crashed, or timed out, between checks
        report.add("kernels: the process", "failed", failure(rc, out), secs, output=tail(out, 40))


def step_sanitizer(report: Report, clock: Clock, py: str, dry: bool, work: Path) -> None:
    tool = None if dry else find_sanitizer()
    for kind, cap in (("memcheck", 110), ("racecheck", 110)):
        if dry or tool is None:
            report.add(f"compute-sanitizer {kind}", "skipped", "dry run: no GPU" if dry else "compute-sanitizer not found "
                       "(PATH, $CUDA_HOME/bin, /usr/local/cuda)")
            continue
        sanitizer = [tool, "--tool", kind, "--error-exitcode", "9", "--print-limit", "20", "--target-processes", "all"]
        step_kernels(report, clock, py, dry, work, sizes=kind, sanitizer=sanitizer, label=kind, cap=cap)


def step_benchmark(report: Report, clock: Clock, py: str, dry: bool, work: Path) -> dict | None:
    name = "benchmark: gpu.py --quick, G1 and G3 (double well)"
    out_json = work / "gpu-quick.json"
    command = [py, str(BENCH / "gpu.py"), "--quick", "--groups", "G1,G3", "--energies", "double_well", "--repeats", "1",
               "--json", str(out_json)]
    # dry: no inductor build on the CPU (a minute): torch.compile runs the eager function, which the figures then equal
    env = {"TORCH_COMPILE_DISABLE": "1"} if dry else None
    rc, out, secs = run(command + (["--device", "cpu"] if dry else []), clock.limit(200), env=env)
    data = json.loads(out_json.read_text()) if rc == 0 and out_json.exists() else None
    if data is None:
        report.add(name, "failed", failure(rc, out), secs, output=tail(out, 40))
        return None
    report.add(name, "passed", f"copy bandwidth {data['copy_bandwidth']['GBps']:.0f} GB/s", secs)
    rows = {(r["group"], r["energy"], r["key"]): r for r in data["analytic"]}
    c, d = rows.get(("G1", "double_well", "c")), rows.get(("G1", "double_well", "d"))
    if c and d and c.get("timing") and d.get("timing"):
        diff = d["figures"].get("max_abs_diff_vs_c")
        bad = [f"({k[2]})" for k, r in rows.items() if r.get("timing") and r["figures"].get("moments_ok") is False]
        ok = diff is not None and diff <= 1e-5 and not bad
        report.add("benchmark: G1 fused chain equals its one-step calls, moments within 5 sigma", "passed" if ok else "failed",
                   f"max abs diff (c) vs (d) {diff:.1e}" + (f"; moments off in rows {', '.join(bad)}" if bad else ""))
    else:
        report.add("benchmark: G1 fused chain equals its one-step calls, moments within 5 sigma", "failed",
                   "rows (c)/(d) did not run: " + "; ".join(str(r.get("skipped")) for r in (c, d) if r))
    w4 = [r for r in data["g3"] if r["workload"] == "W4x100" and r["variant"] == "compile"]
    diff = w4[0].get("figures", {}).get("max_abs_diff_vs_eager") if w4 else None
    if diff is None:
        report.add("benchmark: G3 eager vs compiled, same noise", "failed", "the compiled W4 row did not run: "
                   + (str(w4[0].get("skipped")) if w4 else "no row"))
    else:
        report.add("benchmark: G3 eager vs compiled, same noise", "passed" if diff <= SAME_NOISE_TOL else "failed",
                   f"max abs diff {diff:.1e} (limit {SAME_NOISE_TOL:g})")
    conv = [r for r in data["g3"] if r["workload"] == "ConvPCD" and r["variant"] == "default"]
    name = "benchmark: G3 conv PCD step, captured graph vs per-step loop"
    if not conv or "figures" not in conv[0]:
        report.add(name, "failed", "the default conv PCD row did not run: " + (str(conv[0].get("skipped")) if conv else "no row"))
    elif not str(conv[0].get("path")).startswith("CUDA graph"):
        report.add(name, "skipped", f"the default path is not a captured graph here: {conv[0].get('path')}")
    else:
        rel = max(conv[0]["figures"]["loss_rel_diff_vs_eager"], conv[0]["figures"]["grad_rel_diff_vs_eager"])
        report.add(name, "passed" if rel <= SAME_NOISE_TOL else "failed",
                   f"the same draws: first step's loss and gradient, largest relative difference {rel:.1e} (limit {SAME_NOISE_TOL:g})")
    return data


def step_workloads(report: Report, clock: Clock, py: str, dry: bool, out: Path, groups: list[str]) -> None:
    """``--workloads``: after the checks, ``benchmarks/gpu.py`` at full size for ``groups`` (one process per group, in
    the order given, each saving its tables as it goes), with what is left of the budget: ``<results>-<group>.md``
    (the tables) and ``.json`` (raw) beside the results file. Dry: ``--device cpu --quick``."""
    for group in groups:
        name = f"workloads: gpu.py --groups {group}"
        stem = out.with_name(f"{out.stem}-{group.lower()}")
        command = [py, str(BENCH / "gpu.py"), "--groups", group, "--repeats", "3" if group in ("G1", "G2") else "5",
                   "--json", str(stem.with_suffix(".json"))] + (["--device", "cpu", "--quick"] if dry else [])
        rc, text, secs = run(command, clock.limit(300), env={"TORCH_COMPILE_DISABLE": "1"} if dry else None, keep=1_000_000)
        stem.with_suffix(".md").write_text(text)  # the tables and the progress lines (the raw figures are in .json)
        failed = [line.strip() for line in text.splitlines() if "**FAIL**" in line or "failed:" in line]
        if rc == 0 and not failed:
            report.add(name, "passed", f"tables in {stem.name}.md", secs)
        else:
            report.add(name, "failed", failure(rc, text) if rc != 0 else f"{len(failed)} rows failed or missed their "
                       "correctness check", secs, output="\n".join(failed[:20]) + "\n" + tail(text, 20))


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
        (info / "entry_points.txt").write_text("".join(f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in entries.items()) + "\n"
                                                       for group, entries in groups.items()))
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
    ap.add_argument("--out", type=Path, help="the results file (default: $GPU_CHECK_OUT, else $OUT/gpu-check-<date>.json, "
                                             "else benchmarks/results/gpu-check-<date>.json; dry: in the temp folder)")
    ap.add_argument("--budget", type=float, default=480.0, help="seconds for all steps (default 480)")
    ap.add_argument("--workloads", default="", metavar="GROUPS",
                    help="after the checks, gpu.py at full size for these groups, e.g. S,G3,G1,G2, in the budget left")
    ap.add_argument("--bare-site", type=Path, metavar="DIR", help=argparse.SUPPRESS)  # gpu_check.sh's fallback: see bare_site
    args = ap.parse_args(argv)
    if args.bare_site:
        for info in bare_site(args.bare_site):
            print(info)
        return 0
    out = args.out or default_out(args.dry)
    py = sys.executable
    clock = Clock(args.budget)
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    report = Report()
    meta = environment(args.dry)
    print(f"ebm gpu-check{' --dry' if args.dry else ''}: {meta['device'].get('name', 'no GPU')}", flush=True)
    benchmark = None
    with tempfile.TemporaryDirectory(prefix="ebm-gpu-check-") as tmp:
        work = Path(tmp)
        if not step_environment(report, meta, args.dry):
            report.add("the other steps", "failed", "not run: no GPU here (on a CPU machine, run the dry mode: --dry)")
            return finish(report, meta, clock, args, out, started, None)
        built = step_build(report, clock, py, args.dry)
        step_tests(report, clock, py, args.dry, work)
        if built:
            step_kernels(report, clock, py, args.dry, work)
        else:
            report.add("kernels", "failed", "not run: a build failed")
        benchmark = step_benchmark(report, clock, py, args.dry, work)
        if built:  # the least predictable in time: they get what is left of the budget (the workloads come after:
            # give --budget room for both, e.g. 540 s with --workloads)
            step_sanitizer(report, clock, py, args.dry, work)
        else:
            report.add("compute-sanitizer", "failed", "not run: a build failed")
        if args.workloads:
            step_workloads(report, clock, py, args.dry, out, [g.strip().upper() for g in args.workloads.split(",") if g.strip()])
    return finish(report, meta, clock, args, out, started, benchmark)


def finish(report: Report, meta: dict, clock: Clock, args: argparse.Namespace, out: Path, started: str,
           benchmark: dict | None) -> int:
    """Write the results file, print the summary line; the exit status."""
    seconds = time.monotonic() - clock.start
    summary = {"passed": report.count("passed"), "failed": report.count("failed"), "skipped": report.count("skipped"),
               "seconds": round(seconds, 1), "budget_s": args.budget}
    result = {"tool": "ebm gpu-check", "dry": args.dry, "started": started, **meta, "summary": summary, "checks": report.checks,
              "benchmark": benchmark}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(f"gpu-check: {summary['passed']} passed, {summary['failed']} failed, {summary['skipped']} skipped in {seconds:.0f} s; "
          f"results: {out}", flush=True)
    return 1 if summary["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
