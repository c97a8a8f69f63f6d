"""Packaging metadata of every distribution (the core and the plugins under plugins/): PEP 639 licence, classifiers,
project URLs, dependency bounds, py.typed; and configurations that setuptools reads without a deprecation warning."""

import importlib.metadata
import importlib.resources
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


def test_every_project_is_listed():
    assert {p.parent for p in ROOT.glob("plugins/*/pyproject.toml")} | {ROOT} == {d for d, _ in DISTRIBUTIONS.values()}


@pytest.mark.parametrize("name", DISTRIBUTIONS)
def test_installed_metadata_names_the_licence_classifiers_and_links(name):
    metadata = importlib.metadata.metadata(name)
    assert metadata["License-Expression"] == "Apache-2.0" and metadata.get_all("License-File") == ["LICENSE"]
    licence = importlib.metadata.distribution(name).read_text("licenses/LICENSE")
    assert licence == (ROOT / "LICENSE").read_text() and "Apache License" in licence and "Version 2.0" in licence
    classifiers = metadata.get_all("Classifier")
    assert "Typing :: Typed" in classifiers and "Programming Language :: Python :: 3 :: Only" in classifiers
    assert not [c for c in classifiers if c.startswith("License ::")]  # PEP 639: the expression replaces them
    urls = dict(u.split(", ", 1) for u in metadata.get_all("Project-URL"))
    assert set(urls) == {"Homepage", "Documentation", "Source", "Issues"}
    assert urls == dict(u.split(", ", 1) for u in importlib.metadata.metadata("ebmcore").get_all("Project-URL"))


@pytest.mark.parametrize("name", DISTRIBUTIONS)
def test_ebm_dependencies_are_bounded_to_compatible_versions(name):
    requirements = [Requirement(r) for r in importlib.metadata.requires(name) or []]
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
