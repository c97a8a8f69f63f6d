"""The linter and formatter CI runs: ``ruff check`` over the repository with the rules of ``[tool.ruff]`` in
pyproject.toml (pyflakes: undefined names, unused imports and variables; syntax errors), and ``ruff format --check``
(run ``ruff format .`` to apply it). ruff comes with the ``test`` extra."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing():
    run = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "."], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert "No module named ruff" not in run.stderr, "ruff is missing: install the test extra (pip install -e '.[test]')"
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]


def test_the_code_is_formatted():
    run = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", "--no-cache", "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, "run `ruff format .`:\n" + run.stdout[-6000:] + run.stderr[-2000:]
