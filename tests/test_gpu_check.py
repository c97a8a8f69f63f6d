"""The device check (`make gpu-check`, benchmarks/gpu_check.py) in its dry mode on the CPU, so that it cannot rot:
the command docs/cuda.md shows prints what the page shows (numbers aside) and writes one results file; the
compute-sanitizer step reads a sanitizer's verdict; the bare-machine fallback writes the packages' entry points."""

import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]


def _gpu_check():
    spec = importlib.util.spec_from_file_location("benchmarks_gpu_check", ROOT / "benchmarks" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _shown():
    """The command docs/cuda.md shows for the dry run, and the output lines it shows."""
    page = (ROOT / "docs" / "cuda.md").read_text()
    block = page.split("```\n$ make gpu-check DRY=1\n", 1)[1].split("```", 1)[0]
    return "make gpu-check DRY=1", block.rstrip("\n").split("\n")


def _masked(line: str) -> str:
    """A line with its numbers, hashes and paths masked: what varies from run to run."""
    line = re.sub(r"(/[\w.-]+)+", "PATH", line)
    return re.sub(r"\d[\d,]*(\.\d+)?(e[+-]\d+)?", "N", line)


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_the_dry_run_prints_what_docs_cuda_md_shows_and_writes_one_results_file(tmp_path):
    command, shown = _shown()
    out = tmp_path / "gpu-check.json"
    env = {**{k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS")},  # under `make test`:
           "PYTHON": sys.executable, "GPU_CHECK_OUT": str(out), "OMP_NUM_THREADS": "1"}  # no "make[1]: Entering" lines
    run = subprocess.run(shlex.split(command), cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    printed = run.stdout.rstrip("\n").split("\n")
    # every shown line is printed, in order; "..." stands for lines of the same kind
    at = 0
    for line in shown:
        if line == "...":
            continue
        found = next((i for i in range(at, len(printed)) if _masked(printed[i]) == _masked(line)), None)
        assert found is not None, f"docs/cuda.md shows {line!r}, not printed (after line {at}):\n" + "\n".join(printed)
        at = found + 1
    assert len(printed) == len(shown) - 1 + 12  # "...": the other 11 energies x dtypes, and the step kernels

    result = json.loads(out.read_text())
    assert result["dry"] is True and result["summary"]["failed"] == 0
    assert result["summary"]["passed"] + result["summary"]["skipped"] == len(result["checks"]) > 20
    for check in result["checks"]:
        assert set(check) >= {"name", "status", "reason", "seconds"}, check
        assert check["status"] == "passed" or (check["status"] == "skipped" and check["reason"]), check
    assert {"torch", "python", "nvcc", "compute_sanitizer"} <= set(result["versions"])
    assert result["benchmark"]["g3"] and result["benchmark"]["analytic"]  # gpu.py's raw results, in the same file
    assert f"results: {out}" in printed[-1]


@pytest.mark.parametrize("verdict", ["clean", "errors"])
def test_the_sanitizer_step_reads_the_sanitizers_verdict(tmp_path, verdict):
    gc = _gpu_check()
    fake = tmp_path / "fake-sanitizer"
    if verdict == "clean":  # runs the kernel checks (host build, racecheck sizes) and reports no error
        fake.write_text('#!/bin/sh\n"$@"; rc=$?\necho "========= ERROR SUMMARY: 0 errors"\nexit $rc\n')
    else:
        fake.write_text('#!/bin/sh\necho "========= Invalid __global__ read of size 4 bytes"\n'
                        'echo "========= ERROR SUMMARY: 1 error"\nexit 9\n')
    fake.chmod(0o755)
    report = gc.Report()
    gc.step_kernels(report, gc.Clock(300), sys.executable, True, tmp_path, sizes="racecheck", sanitizer=[str(fake)],
                    label="racecheck", cap=200)
    (check,) = report.checks
    assert check["name"] == "compute-sanitizer racecheck"
    if verdict == "clean":
        assert check["status"] == "passed", check
        assert check["reason"].startswith("14 kernel checks, ========= ERROR SUMMARY: 0 errors"), check
    else:
        assert check["status"] == "failed" and "the sanitizer reported errors" in check["reason"], check
        assert "Invalid __global__ read" in check["output"]


def test_the_bare_machine_fallback_declares_every_packages_entry_points(tmp_path):
    gc = _gpu_check()
    infos = gc.bare_site(tmp_path)
    pyprojects = [ROOT / "pyproject.toml", *sorted(ROOT.glob("plugins/*/pyproject.toml"))]
    assert len(infos) == len(pyprojects)
    for pyproject, info in zip(pyprojects, infos):
        project = tomllib.loads(pyproject.read_text())["project"]
        assert f"Name: {project['name']}\n" in (info / "METADATA").read_text()
        for name, target in project["entry-points"]["ebmcore"].items():
            assert f"{name} = {target}\n" in (info / "entry_points.txt").read_text()


def test_the_workloads_step_writes_the_tables_and_flags_a_failed_correctness_check(tmp_path, monkeypatch):
    """``--workloads``: gpu.py after the checks (dry: on the CPU, quick), its tables beside the results file; a row whose
    correctness check fails, or that failed to run, fails the step."""
    check = _gpu_check()
    report, clock = check.Report(), check.Clock(300)
    out = tmp_path / "gpu-check.json"
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    check.step_workloads(report, clock, sys.executable, True, out, ["S"])
    assert [c["status"] for c in report.checks] == ["passed"], report.checks
    tables = (tmp_path / "gpu-check-s.md").read_text()
    assert tables.count("| S") >= 8 and json.loads((tmp_path / "gpu-check-s.json").read_text())["seeds"]
    monkeypatch.setattr(check, "run", lambda *a, **k: (0, "| S1 | ... | **FAIL**: ≤ 5 |\n", 1.0))
    check.step_workloads(report, clock, sys.executable, True, out, ["S"])
    assert report.checks[-1]["status"] == "failed" and "1 rows failed" in report.checks[-1]["reason"]
