"""The documentation site builds strictly, and its figure script runs.

``mkdocs build --strict`` fails on any warning: a broken link or anchor, a page missing from the
nav, an image that does not exist, a docstring mkdocstrings cannot render. The figure script runs
in its quick mode (tiny sizes) into a temporary directory and must write every figure the pages
use. Both write outside the repository.
"""

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
FIGURES = DOCS / "assets" / "figures"


def _run(args, **kwargs):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, **kwargs)


def _needs(module: str, extra: str) -> None:
    """Skip, saying why, where an optional extra is missing; fail under CI, which installs every extra."""
    if importlib.util.find_spec(module) is None:
        message = f"{module} is not installed: install the {extra} extra (`pip install -e '.[{extra}]'`; `make setup` does)."
        (pytest.fail if os.environ.get("CI") else pytest.skip)(message)


def test_mkdocs_build_strict(tmp_path):
    _needs("mkdocs", "docs")
    _needs("mkdocstrings", "docs")
    site = tmp_path / "site"
    proc = _run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)], timeout=300)
    problems = [line for line in proc.stderr.splitlines() if line.startswith(("WARNING", "ERROR"))]
    assert proc.returncode == 0, "`mkdocs build --strict` failed (run `make docs` to reproduce):\n" + "\n".join(
        problems or proc.stderr.splitlines()[-30:]
    )
    for page in [
        "index.html",
        "getting-started/index.html",
        "performance/index.html",
        "api/ebmcore/index.html",
        "api/ebm_samplers/index.html",
        "api/ebm_losses/index.html",
    ]:
        assert (site / page).is_file(), f"the built site lacks {page}"
    api = (site / "api" / "ebm_samplers" / "index.html").read_text()
    assert "MALASampler" in api and "warmup" in api, "the API reference was not generated from the docstrings"


def _figures_used_by_the_pages():
    used = set()
    for page in DOCS.rglob("*.md"):
        used |= set(re.findall(r"assets/figures/([\w-]+\.png)", page.read_text()))
    return used


def test_every_figure_the_pages_use_is_committed():
    used = _figures_used_by_the_pages()
    assert used, "no page shows a figure"
    missing = sorted(name for name in used if not (FIGURES / name).is_file())
    assert not missing, f"run `.venv/bin/python docs/scripts/make_figures.py` and commit {missing}"


def test_the_figure_script_runs_in_quick_mode(tmp_path):
    _needs("matplotlib", "plot")
    proc = _run([sys.executable, str(DOCS / "scripts" / "make_figures.py"), "--quick", "--out", str(tmp_path)], timeout=300)
    assert proc.returncode == 0, f"docs/scripts/make_figures.py --quick failed:\n{proc.stderr[-4000:]}"
    written = {p.name for p in tmp_path.glob("*.png")}
    assert _figures_used_by_the_pages() <= written, "the script no longer draws every figure the pages use"
    assert written == {p.name for p in FIGURES.glob("*.png")}, "the committed figures differ from what the script draws"
