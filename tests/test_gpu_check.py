"""The device check (`make gpu-check`, benchmarks/gpu_check.py) in its dry mode on the CPU, so that it cannot rot:
the command docs/cuda.md shows prints what the page shows (numbers aside), runs every step in the documented order
and writes one results file with each group's tables beside it; the compute-sanitizer step runs each tool and reads
its verdict; the distributed step runs docs/distributed.md's example on two ranks; a group cut off by its time limit
keeps its tables; the bare-machine fallback writes the packages' entry points."""

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
SANITIZERS = ("memcheck", "racecheck", "synccheck", "initcheck")
GROUPS = ("S", "G3", "T", "G1")  # gpu.py's groups, in the order the check runs them


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
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS")},  # under `make test`:
        "PYTHON": sys.executable,
        "GPU_CHECK_OUT": str(out),
        "OMP_NUM_THREADS": "1",
    }  # no "make[1]: Entering" lines
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
    assert f"results: {out}" in printed[-1]
    # every step, in the order gpu_check.py's docstring gives its reasons for: the checks, then the groups
    steps = [check["name"].split(":")[0] for check in result["checks"]]
    assert [s for i, s in enumerate(steps) if s not in steps[:i]] == [
        "environment",
        "build",
        "kernels",
        *(f"compute-sanitizer {kind}" for kind in SANITIZERS),
        "GPU tests",
        "distributed",
        *(f"workloads {group}" for group in GROUPS),
    ]
    assert steps == sorted(steps, key=steps.index), "a step's checks are not together"
    status = {c["name"].split(": ")[-1] if c["name"].startswith("distributed") else c["name"]: c for c in result["checks"]}
    for kind in SANITIZERS:
        assert status[f"compute-sanitizer {kind}"]["reason"] == "dry run: no GPU"
    assert status["docs/distributed.md's example, torchrun with 2 processes, gloo"]["status"] == "passed"
    assert status["docs/distributed.md's example, torchrun with 2 processes, nccl"]["reason"] == "dry run: no GPU"
    # one results file with each group's raw results, and its tables beside it
    for group in GROUPS:
        assert f"\n## {group}" in (tmp_path / f"gpu-check-{group.lower()}.md").read_text()  # its tables
        assert result["workloads"][group] == json.loads((tmp_path / f"gpu-check-{group.lower()}.json").read_text())
    assert result["workloads"]["G3"]["g3"] and result["workloads"]["G1"]["analytic"] and result["workloads"]["S"]["seeds"]
    assert {
        "workloads G1: the fused chain equals its one-step calls, moments within 5 sigma",
        "workloads G3: eager vs compiled, same noise (W4 states, W5 loss and gradient)",
    } <= set(status)


@pytest.mark.parametrize("verdict", ["clean", "errors"])
def test_the_sanitizer_step_reads_the_sanitizers_verdict(tmp_path, verdict):
    gc = _gpu_check()
    fake = tmp_path / "fake-sanitizer"
    if verdict == "clean":  # runs the kernel checks (host build, racecheck sizes) and reports no error
        fake.write_text('#!/bin/sh\n"$@"; rc=$?\necho "========= ERROR SUMMARY: 0 errors"\nexit $rc\n')
    else:
        fake.write_text(
            '#!/bin/sh\necho "========= Invalid __global__ read of size 4 bytes"\n'
            'echo "========= ERROR SUMMARY: 1 error"\nexit 9\n'
        )
    fake.chmod(0o755)
    report = gc.Report()
    gc.step_kernels(
        report,
        gc.Clock(300),
        sys.executable,
        True,
        tmp_path,
        sizes="racecheck",
        sanitizer=[str(fake)],
        label="racecheck",
        cap=200,
    )
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


def test_every_sanitizer_tool_runs_the_kernel_checks_at_its_sizes(tmp_path, monkeypatch):
    gc = _gpu_check()
    calls = tmp_path / "calls"
    fake = tmp_path / "fake-sanitizer"  # records its arguments, reports an error, runs nothing
    fake.write_text(f'#!/bin/sh\necho "$@" >> {calls}\necho "========= ERROR SUMMARY: 1 error"\nexit 9\n')
    fake.chmod(0o755)
    monkeypatch.setattr(gc, "find_sanitizer", lambda: str(fake))
    report = gc.Report()
    gc.step_sanitizer(report, gc.Clock(300), sys.executable, False, tmp_path)
    assert [c["name"] for c in report.checks] == [f"compute-sanitizer {kind}" for kind in SANITIZERS]
    assert all(c["status"] == "failed" and "the sanitizer reported errors" in c["reason"] for c in report.checks)
    ran = calls.read_text().splitlines()
    assert [line.split()[1] for line in ran] == list(SANITIZERS)  # --tool <kind>
    assert [line.split("--sizes ")[1].split()[0] for line in ran] == [sizes for _, sizes, _ in gc.SANITIZERS]
    assert all(sizes in ("memcheck", "racecheck") for _, sizes, _ in gc.SANITIZERS)  # gpu_check_kernels.py's small sizes


@pytest.mark.parametrize("gpus", [1, 2])
def test_the_distributed_step_runs_the_docs_example_on_two_ranks_nccl_only_on_two_gpus(tmp_path, monkeypatch, gpus):
    """The example of docs/distributed.md under torchrun with 2 processes; rank 0 alone prints, every chain gathered.
    On one GPU NCCL is skipped, saying why; output of two single-process runs (both ranks print) fails."""
    gc = _gpu_check()
    ran = []

    def fake_run(command, timeout, env=None, keep=6000):
        ran.append((command, env))
        code = Path(command[-1]).read_text()
        assert "distributed.init()" in code and command[1:6] == [
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
        ]
        line = "torch.Size([1000, 10]) tensor(1.0293" + (", device='cuda:0')" if env["EBM_DIST_BACKEND"] == "nccl" else ")")
        return 0, f"W1128 a torchrun warning\n{line} 0.69975\n" * (2 if "both" in command[-1] else 1), 3.0

    monkeypatch.setattr(gc, "run", fake_run)
    report = gc.Report()
    gc.step_distributed(report, gc.Clock(300), sys.executable, False, tmp_path, gpus)
    gloo, nccl = report.checks
    assert gloo["status"] == "passed" and gloo["reason"].startswith("rank 0 printed: torch.Size([1000, 10])"), gloo
    if gpus == 1:
        assert nccl["status"] == "skipped" and "Duplicate GPU detected" in nccl["reason"], nccl
    else:
        assert nccl["status"] == "passed", nccl
    assert [env["EBM_DIST_BACKEND"] for _, env in ran] == ["gloo", "nccl"][:gpus]
    both = tmp_path / "both"  # each process ran alone: both print
    both.mkdir()
    gc.step_distributed(report, gc.Clock(300), sys.executable, False, both, 1)
    assert report.checks[-2]["status"] == "failed" and "2 printed" in report.checks[-2]["reason"]


def test_a_failed_row_fails_its_group_and_a_group_cut_off_keeps_its_tables(tmp_path, monkeypatch):
    """A row whose correctness check fails, or that failed to run, fails the group. A group killed at its time limit
    fails, and keeps its tables: T's made from the rows its .json saved (gpu.py prints T's table at its end)."""
    gc = _gpu_check()
    out = tmp_path / "gpu-check.json"
    eager = {
        "workload": "W4",
        "variant": "eager per-step loop, IEEE products",
        "timing": {"median_s": 0.2},
        "figures": {"mean_energy": -0.075, "nonfinite_chains": 0},
    }
    chain = {
        **eager,
        "variant": "Triton chain, block_n 64, 4 warps, tf32",
        "timing": {"median_s": 0.02},
        "block_n": 64,
        "num_warps": 4,
        "precision": "tf32",
        "figures": {"mean_energy": -0.075, "nonfinite_chains": 0, "z_vs_eager": 9.0},
    }

    def fake_run(command, timeout, env=None, keep=6000):
        raw = Path(command[command.index("--json") + 1])
        if "T" in command:  # killed while measuring its third row; the json holds the first two
            raw.write_text(json.dumps({"triton": [eager, chain]}))
            return None, "  T W4: eager per-step loop ...\n[killed after 240 s]", 240.0
        raw.write_text(json.dumps({"seeds": [{"id": "S1"}]}))
        return 0, "| S1 | ... | **FAIL**: ≤ 5 |\n", 1.0

    monkeypatch.setattr(gc, "run", fake_run)
    report = gc.Report()
    results = gc.step_workloads(report, gc.Clock(300), sys.executable, True, out, ["S", "T"])
    s, t = report.checks
    assert s["status"] == "failed" and "1 rows failed" in s["reason"] and "**FAIL**" in s["output"], s
    assert t["status"] == "failed" and t["reason"] == "timed out; 1 rows failed or missed their correctness check", t
    tables = (tmp_path / "gpu-check-t.md").read_text()
    assert "## T, cut off by its time limit: the 2 rows measured" in tables
    assert "| W4 | Triton chain, block_n 64, 4 warps, tf32 | 20.00 | 10.00 |" in tables and "**FAIL**" in tables
    assert results["T"]["triton"] == [eager, chain]


def test_the_g1_and_g3_checks_fail_where_the_same_draws_differ():
    gc = _gpu_check()
    report = gc.Report()
    g1 = [
        {"group": "G1", "energy": "gaussian", "key": k, "timing": {"median_s": 1.0}, "figures": f}
        for k, f in (("c", {"moments_ok": True}), ("d", {"moments_ok": True, "max_abs_diff_vs_c": 3e-3}))
    ]
    gc.check_g1(report, {"analytic": g1})
    g3 = [
        {"workload": "W4x100", "variant": "compile", "figures": {"max_abs_diff_vs_eager": 2e-7}},
        {"workload": "W5x100", "variant": "compile", "figures": {"loss_rel_diff_vs_eager": 0.0, "grad_rel_diff_vs_eager": 0.4}},
        {"workload": "ConvPCD", "variant": "default", "skipped": "failed: RuntimeError: capture"},
    ]
    gc.check_g3(report, {"g3": g3})
    assert [c["status"] for c in report.checks] == ["failed"] * 3, report.checks
    assert "(c) vs (d) 3.0e-03 over gaussian" in report.checks[0]["reason"]
    assert "W5 largest relative difference 4.0e-01" in report.checks[1]["reason"]
    assert "did not run: failed: RuntimeError: capture" in report.checks[2]["reason"]
