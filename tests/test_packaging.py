"""Packaging metadata of every distribution (the core and the plugins under plugins/): PEP 639 licence, classifiers,
project URLs, dependency bounds, py.typed; and configurations that setuptools reads without a deprecation warning."""

import importlib.metadata
import importlib.resources
import sys
import warnings
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
DISTRIBUTIONS = {  # distribution -> (project directory, package)
    "ebmcore": (ROOT, "ebmcore"),
    "ebm-samplers": (ROOT / "plugins" / "ebm_samplers", "ebm_samplers"),
    "ebm-losses": (ROOT / "plugins" / "ebm_losses", "ebm_losses"),
    "ebm-cuda": (ROOT / "plugins" / "ebm_cuda", "ebm_cuda"),
}


def _installed(name: str) -> importlib.metadata.Distribution:
    """The installed distribution ``name``, never an ``*.egg-info`` that a build left in a source folder on
    ``sys.path`` (``pip wheel --no-build-isolation .`` writes ``ebmcore.egg-info`` into the checkout)."""
    sources = {d.resolve() for d, _ in DISTRIBUTIONS.values()}
    path = [p for p in sys.path if Path(p or ".").resolve() not in sources]
    found = next(iter(importlib.metadata.distributions(name=name, path=path)), None)
    assert found is not None, f"{name} is not installed (make setup)"
    return found


def test_a_build_left_in_the_checkout_is_not_taken_for_the_installed_metadata(tmp_path, monkeypatch):
    stale = tmp_path / "ebmcore.egg-info"  # what a wheel build leaves next to pyproject.toml: no licence file in it
    stale.mkdir()
    (stale / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: ebmcore\nVersion: 0.0.1\n")
    monkeypatch.setitem(DISTRIBUTIONS, "ebmcore", (tmp_path, "ebmcore"))
    monkeypatch.syspath_prepend(str(tmp_path))
    assert importlib.metadata.version("ebmcore") == "0.0.1"  # what importlib finds first
    assert _installed("ebmcore").version != "0.0.1"


def test_every_project_is_listed():
    assert {p.parent for p in ROOT.glob("plugins/*/pyproject.toml")} | {ROOT} == {d for d, _ in DISTRIBUTIONS.values()}


@pytest.mark.parametrize("name", DISTRIBUTIONS)
def test_installed_metadata_names_the_licence_classifiers_and_links(name):
    metadata = _installed(name).metadata
    assert metadata["License-Expression"] == "Apache-2.0" and metadata.get_all("License-File") == ["LICENSE"]
    licence = _installed(name).read_text("licenses/LICENSE")
    assert licence == (ROOT / "LICENSE").read_text() and "Apache License" in licence and "Version 2.0" in licence
    classifiers = metadata.get_all("Classifier")
    assert "Typing :: Typed" in classifiers and "Programming Language :: Python :: 3 :: Only" in classifiers
    assert not [c for c in classifiers if c.startswith("License ::")]  # PEP 639: the expression replaces them
    urls = dict(u.split(", ", 1) for u in metadata.get_all("Project-URL"))
    assert set(urls) == {"Homepage", "Documentation", "Source", "Issues"}
    assert urls == dict(u.split(", ", 1) for u in _installed("ebmcore").metadata.get_all("Project-URL"))


@pytest.mark.parametrize("name", DISTRIBUTIONS)
def test_ebm_dependencies_are_bounded_to_compatible_versions(name):
    requirements = [Requirement(r) for r in _installed(name).requires or []]
    ours = [r for r in requirements if r.name in DISTRIBUTIONS]
    assert all(r.marker is None for r in ours)
    for r in ours:  # what docs/plugins.md advises third parties: this minor series, not the next
        assert r.specifier.contains("0.1.0") and not r.specifier.contains("0.2.0"), f"{name}: {r}"
    if name != "ebmcore":
        assert "ebmcore" in {r.name for r in ours}
    # importlib-metadata only where the standard library lacks what is used (none on Python >= 3.10)
    assert not [r for r in requirements if r.name == "importlib-metadata" and r.marker is None]


@pytest.mark.parametrize("name", DISTRIBUTIONS)
def test_py_typed_ships_in_every_package(name, monkeypatch):
    directory, package = DISTRIBUTIONS[name]
    assert importlib.resources.files(package).joinpath("py.typed").is_file()
    dist = _configured(directory, monkeypatch)
    assert "py.typed" in dist.package_data[package]  # so a wheel carries it


@pytest.mark.parametrize("name", DISTRIBUTIONS)
def test_setuptools_reads_each_configuration_without_a_warning(name, monkeypatch):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a SetuptoolsDeprecationWarning (a licence table, classifiers) fails
        dist = _configured(DISTRIBUTIONS[name][0], monkeypatch)
    assert dist.metadata.license_expression == "Apache-2.0" and dist.metadata.license_files == ["LICENSE"]


def _configured(directory, monkeypatch):
    """A setuptools Distribution configured from ``directory/pyproject.toml``, as a build would (setuptools >= 77)."""
    from setuptools.config.pyprojecttoml import apply_configuration
    from setuptools.dist import Distribution

    monkeypatch.chdir(directory)  # license-files and package data are found relative to the project
    return apply_configuration(Distribution(), str(directory / "pyproject.toml"))


def _imported_distributions(package_dir: Path) -> dict[str, str]:
    """The distributions (normalised names) providing the third-party modules that the package's files import,
    anywhere in a file (a lazy import too) -> the module."""
    import ast
    import re

    provided = importlib.metadata.packages_distributions()
    found: dict[str, str] = {}
    for path in package_dir.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module]
                if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                else []
            )
            for top in {n.split(".")[0] for n in names} - set(sys.stdlib_module_names):
                for dist in provided.get(top, []):
                    found[re.sub(r"[-_.]+", "-", dist).lower()] = top
    return found


@pytest.mark.parametrize("name", DISTRIBUTIONS)
def test_every_imported_distribution_is_required(name):
    # ebmcore imported tqdm (its progress bars) without requiring it: `pip install ebmcore` then progress=True failed
    directory, package = DISTRIBUTIONS[name]
    required = {Requirement(r).name.lower() for r in _installed(name).requires or []}  # extras included
    missing = {
        dist: module
        for dist, module in _imported_distributions(directory / package).items()
        if dist not in required and dist != name
    }
    assert not missing, f"{name} imports {missing} but its pyproject.toml requires none of them"


def test_one_torch_floor_for_every_distribution():
    floors = {}
    for name in DISTRIBUTIONS:
        torch_requirements = [Requirement(r) for r in _installed(name).requires or [] if Requirement(r).name == "torch"]
        floors[name] = {str(r.specifier) for r in torch_requirements}
    assert len({frozenset(f) for f in floors.values()}) == 1, f"torch requirements differ: {floors}"
