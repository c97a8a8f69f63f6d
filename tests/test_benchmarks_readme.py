"""benchmarks/README.md's "Current results" section is what benchmarks/report.py writes from the
committed results files, and the report takes each workload from the latest run that measured it."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "report.py"


def _report():
    spec = importlib.util.spec_from_file_location("benchmarks_report", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look the module up while the class is built
    spec.loader.exec_module(module)
    return module


def test_readme_is_up_to_date():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--check"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr or proc.stdout


def _read_by_scripts(name: str) -> bool:
    """Whether a script outside the benchmark report names the results file ``name`` (e.g. the docs' figures)."""
    scripts = [*(ROOT / "docs" / "scripts").glob("*.py"), *(ROOT / "benchmarks").glob("*.py")]
    return any(name in path.read_text(encoding="utf-8") for path in scripts if path.name != "report.py")


def test_every_results_file_is_used():
    """A results file that no table uses is deleted (git keeps the history), unless a script still reads it."""
    report = _report()
    runs = report.load_runs(ROOT / "benchmarks" / "results")
    used = {run.name for run in report.latest_per_workload(runs).values()}
    unused = {run.name for run in runs} - used
    assert not {name for name in unused if not _read_by_scripts(name)}, (
        "results files no table uses and no script reads: delete them (git keeps the history)"
    )


def _result(median_s: float, ratio: float, z: float) -> dict:
    return {
        "median_s": median_s,
        "min_s": median_s,
        "max_s": median_s,
        "warmup_s": median_s,
        "samples_per_s": 1.0 / median_s,
        "ratio_vs_ebm": ratio,
        "ratio_vs_ebm_step": None,
        "figures": {"moments_z_max": z, "moments_ok": z <= 5, "law": "ULA law after 10 steps"},
    }


def _run(date: str, commit: str, workloads: dict[str, float]) -> dict:
    """A results file in run.py's shape: ebm's median per workload, torchebm 3x slower."""
    return {
        "meta": {
            "date": date,
            "command": "run.py",
            "machine": "test machine",
            "threads": 1,
            "repeats": 5,
            "quick": False,
            "versions": {"torch": "x"},
            "loadavg_start": "0 0 0",
            "git": {"commit": commit, "modified": []},
        },
        "workloads": {
            wid: {
                "workload": {
                    "id": wid,
                    "what": f"Langevin, {wid}",
                    "kind": "langevin",
                    "target": "gaussian",
                    "guide": "",
                    "guide_rate": 0.0,
                },
                "results": {"ebm": _result(t, 1.0, 1.0), "torchebm": _result(3 * t, 3.0, 1.5)},
                "loadavg_end": "0 0 0",
            }
            for wid, t in workloads.items()
        },
    }


def test_latest_run_per_workload(tmp_path):
    report = _report()
    results = tmp_path / "results"
    results.mkdir()
    # the older run measured W1 and W2, the newer one (named so that it sorts first) only W2
    (results / "b-old.json").write_text(json.dumps(_run("2026-01-01T10:00:00+00:00", "aaaaaaa", {"W1": 0.01, "W2": 0.02})))
    (results / "a-new.json").write_text(json.dumps(_run("2026-01-02T10:00:00+00:00", "bbbbbbb", {"W2": 0.05})))
    (results / "gpu.json").write_text(json.dumps({"meta": {"date": "2026-01-03T00:00:00+00:00"}, "analytic": []}))
    quick = _run("2026-01-04T10:00:00+00:00", "ccccccc", {"W1": 9.0})
    quick["meta"]["quick"] = True
    (results / "c-quick.json").write_text(json.dumps(quick))

    chosen = report.latest_per_workload(report.load_runs(results))
    assert {wid: run.name for wid, run in chosen.items()} == {"W1": "b-old.json", "W2": "a-new.json"}

    readme = tmp_path / "README.md"
    readme.write_text(f"# Title\n\n{report.START}\nstale\n{report.END}\n\nkept\n")
    check = [sys.executable, str(SCRIPT), "--results", str(results), "--readme", str(readme), "--check"]
    stale = subprocess.run(check, capture_output=True, text=True, timeout=60)
    assert stale.returncode == 1 and "run `python benchmarks/report.py`" in stale.stderr

    assert report.main(["--results", str(results), "--readme", str(readme)]) == 0
    text = readme.read_text()
    assert text.startswith("# Title\n\n") and text.endswith("\n\nkept\n") and "stale" not in text
    rows = {line.split(" ")[1]: line for line in text.splitlines() if line.startswith("| W")}
    assert "10.0 ms (1.0)" in rows["W1"] and "`aaaaaaa`" in rows["W1"] and "(results/b-old.json)" in rows["W1"]
    assert "50.0 ms (1.0)" in rows["W2"] and "`bbbbbbb`" in rows["W2"] and "(results/a-new.json)" in rows["W2"]
    assert "3.00 (1.5)" in rows["W2"]
    assert "c-quick" not in text and "gpu.json" not in text
    assert report.main(["--results", str(results), "--readme", str(readme), "--check"]) == 0
