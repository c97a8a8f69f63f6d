"""benchmarks/gpu_check.sh's install step (``--install-only``) on a copy of this tree, given a Python that imports
neither copy's ebm packages. On the GPU image of issue 38 that Python was itself a virtual environment with torch
(/opt/torch/.venv); the one running these tests is one too, so it stands in for it."""

import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COPIED = ("pyproject.toml", "README.md", "LICENSE", "ebmcore", "plugins", "benchmarks/gpu_check.sh", "benchmarks/gpu_check.py")
IMPORTS = "import torch, numpy, ebmcore, ebm_cuda, ebm_samplers, ebm_losses; print(ebmcore.__file__)"


@pytest.fixture
def tree(tmp_path) -> Path:
    """The packages and the script, copied: this test's Python imports the packages of this checkout, not the copy's."""
    dest = tmp_path / "tree"
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build", ".pytest_cache")
    for name in COPIED:
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        copy = shutil.copytree if (ROOT / name).is_dir() else shutil.copy2
        copy(ROOT / name, dest / name, **({"ignore": ignore} if copy is shutil.copytree else {}))
    return dest


ENV = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}


def _install(tree: Path, python: str) -> subprocess.CompletedProcess:
    """``gpu_check.sh --install-only`` in ``tree``, with ``PYTHON=python``."""
    return subprocess.run(
        ["bash", str(tree / "benchmarks" / "gpu_check.sh"), "--install-only"],
        cwd=tree,
        env={**ENV, "PYTHON": python},
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.skipif(sys.prefix == sys.base_prefix, reason="the tests' Python is not a virtual environment")
def test_over_a_virtual_environment_the_new_one_imports_its_torch_and_this_trees_packages(tree, tmp_path):
    run = _install(tree, sys.executable)
    assert run.returncode == 0, run.stderr[-4000:]
    assert run.stdout == ".gpu-check/venv/bin/python\n", run.stdout + run.stderr[-4000:]  # and no PYTHONPATH
    imports = subprocess.run(
        [str(tree / ".gpu-check/venv/bin/python"), "-c", IMPORTS],
        cwd=tmp_path,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert imports.returncode == 0, imports.stderr[-3000:]
    assert Path(imports.stdout.strip()).is_relative_to(tree)


def test_an_environment_that_does_not_import_torch_is_removed_saying_why(tree, tmp_path):
    """A Python that imports torch only through a .pth file of its own: the new environment, which lists that Python's
    site-packages but reads no .pth file there, does not; it is removed, and the sources go on PYTHONPATH."""
    parent = tmp_path / "parent"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(parent)], check=True, timeout=120)
    purelib = "import sysconfig; print(sysconfig.get_path('purelib'))"
    parent_site = subprocess.run(
        [str(parent / "bin" / "python"), "-c", purelib], capture_output=True, text=True, check=True
    ).stdout.strip()
    Path(parent_site, "torch_elsewhere.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    run = _install(tree, str(parent / "bin" / "python"))
    assert run.returncode == 0, run.stderr[-4000:]
    assert f".gpu-check/venv does not import torch and numpy, which {parent}/bin/python does" in run.stderr, run.stderr
    assert not (tree / ".gpu-check" / "venv").exists()  # no later command picks it up
    assert run.stdout.startswith(f"{parent}/bin/python\nPYTHONPATH={tree}:"), run.stdout
