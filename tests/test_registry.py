"""Registry lookups: names, provenance, clear errors for unknown and clashing names; the first-party plugins' install
hints, READMEs and dependency table match what they ship."""

import re
import sys
from pathlib import Path

import pytest

import ebmcore
from ebmcore import registry
from ebmcore.errors import DuplicateComponentError, InputError, UnknownComponentError
from ebmcore.testing import isolated_plugins

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


class _Sampler(ebmcore.Sampler):
    def init(self, x):
        return x

    def step(self, state, **kw):
        return state, {}


def _plugin(name, *, override=False, kind="sampler"):
    class P:
        @ebmcore.hookimpl
        def ebm_register_samplers(self, registry):
            if kind == "sampler":
                registry.register_sampler(name, _Sampler, override=override)
            else:
                registry.register_energy(name, ebmcore.GaussianEnergy)

    return P()


def test_builtin_energies_and_torch_backend_are_registered():
    builtin = [n for n in registry.names("energy") if registry.get("energy", n).distribution == "ebmcore"]
    assert builtin == sorted(
        ["gaussian", "double_well", "rosenbrock", "harmonic", "gaussian_mixture", "ackley", "rastrigin", "mlp"]
    )
    assert "torch" in registry.names("kernel")
    entry = registry.get("energy", "gaussian")
    assert (entry.distribution, entry.version, entry.plugin) == ("ebmcore", ebmcore.__version__, "builtin")
    assert isinstance(entry(dim=3), ebmcore.GaussianEnergy)


def test_unknown_name_lists_available_names_and_suggests_a_typo_fix():
    with pytest.raises(UnknownComponentError) as err:
        registry.get("energy", "gausian")
    msg = str(err.value)
    assert "no energy named 'gausian'" in msg and "double_well" in msg and "Did you mean 'gaussian'?" in msg


def test_unknown_first_party_name_says_what_to_install():
    with isolated_plugins():
        with pytest.raises(UnknownComponentError) as err:
            registry.get("sampler", "mala")
    checkout = Path(__file__).resolve().parents[1] / "plugins" / "ebm_samplers"
    assert f"install it from this checkout with `pip install -e {checkout}`" in str(err.value)
    assert "(where it is published: `pip install ebm-samplers`)" in str(err.value)


def test_the_install_hint_outside_a_checkout_names_the_index_first(monkeypatch):
    from ebmcore import components

    monkeypatch.setattr(components, "declared_plugins", lambda: {})  # an installed ebmcore, no plugins/ beside it
    assert components.install_hint("ebm-losses") == (
        "install it with `pip install ebm-losses` (from a source checkout: `pip install -e plugins/ebm_losses`)"
    )


def test_the_install_hints_match_what_the_first_party_plugins_register():
    from ebmcore.components import declared_plugins
    from ebmcore import cli, plugins

    cli._parser()  # the plugins add their commands (recorded) when ebm builds its parser
    session = plugins.session()
    assert set(declared_plugins()) == {"ebm-samplers", "ebm-losses", "ebm-cuda"}
    for dist, (_, hinted) in declared_plugins().items():
        records = [r for r in session.records.values() if r.distribution == dist]
        if not records:
            continue  # not installed here: nothing to compare with
        (record,) = records
        assert record.status == "loaded", record.error
        provided = {kind: tuple(names) for kind, names in record.provides.items()}
        if record.commands:
            provided["command"] = tuple(record.commands)
        assert {k: sorted(v) for k, v in provided.items()} == {k: sorted(v) for k, v in hinted.items()}, dist
    assert any(r.distribution == "ebm-samplers" for r in session.records.values())  # the suite installs them


def test_unknown_kind_is_an_error():
    with pytest.raises(UnknownComponentError, match="the kinds are energy, sampler"):
        registry.names("samplers")


def test_two_plugins_registering_one_name_is_an_error_naming_both():
    with isolated_plugins(("first", _plugin("dup")), ("second", _plugin("dup"))):
        with pytest.raises(DuplicateComponentError) as err:
            registry.get("sampler", "dup")
        assert "first" in str(err.value) and "second" in str(err.value) and "override=True" in str(err.value)
        assert registry.names("sampler") == ["dup"]  # listed, but unusable until resolved
        assert registry.entries("sampler") == []


def test_an_explicit_override_wins():
    with isolated_plugins(("first", _plugin("dup")), ("second", _plugin("dup", override=True))):
        assert registry.get("sampler", "dup").plugin == "second"


def test_two_overrides_still_clash():
    with isolated_plugins(("a", _plugin("dup", override=True)), ("b", _plugin("dup", override=True))):
        with pytest.raises(DuplicateComponentError, match="only one plugin may declare override"):
            registry.get("sampler", "dup")


def test_registering_from_the_wrong_hook_fails_that_plugin_only():
    with isolated_plugins(("confused", _plugin("x", kind="energy"))) as s:
        assert s.records["confused"].status == "failed"
        assert "register energy components from ebm_register_energies" in s.records["confused"].error
        assert "gaussian" in registry.names("energy")


def test_bad_names_and_non_callables_are_rejected():
    class Bad:
        @ebmcore.hookimpl
        def ebm_register_samplers(self, registry):
            registry.register_sampler("Bad Name", _Sampler)

    class NotCallable:
        @ebmcore.hookimpl
        def ebm_register_samplers(self, registry):
            registry.register_sampler("fine", 42)

    with isolated_plugins(("bad", Bad()), ("nc", NotCallable())) as s:
        assert "lower-case" in s.records["bad"].error
        assert "not callable" in s.records["nc"].error


def test_a_wrong_keyword_names_the_parameters_the_component_takes():
    with pytest.raises(InputError) as err:
        ebmcore.energy("gaussian", dim=2, foo=1)
    msg = str(err.value)
    assert "energy 'gaussian' (GaussianEnergy): got an unexpected keyword argument 'foo'" in msg
    assert "it takes mean, covariance, precision, dim" in msg
    with pytest.raises(InputError, match=r"energy 'double_well' .*it takes dim, barrier"):
        registry.get("energy", "double_well")(dims=2)


def test_the_first_party_readmes_name_every_component_and_command():
    from ebmcore.components import declared_plugins

    root = Path(__file__).resolve().parents[1] / "plugins"
    for dist, (_, provided) in declared_plugins().items():
        readme = (root / dist.replace("-", "_") / "README.md").read_text()
        missing = [
            f"{kind} {name}"
            for kind, names in provided.items()
            if kind != "kernel"
            for name in names
            if f"`{name}`" not in readme and f"`ebm {name}`" not in readme
        ]
        assert missing == [], f"plugins/{dist.replace('-', '_')}/README.md does not name {missing}"


def test_getting_started_lists_every_dependency_of_every_package():
    root = Path(__file__).resolve().parents[1]
    page = (root / "docs" / "getting-started.md").read_text()
    for pyproject in [root / "pyproject.toml", *sorted((root / "plugins").glob("*/pyproject.toml"))]:
        project = tomllib.loads(pyproject.read_text())["project"]
        row = next(line for line in page.splitlines() if line.startswith(f"| `{project['name']}` "))
        for requirement in project["dependencies"]:
            assert f"`{re.sub(r';.*', '', requirement).strip()}`" in row, f"{project['name']}: {requirement}"


def test_the_readme_names_every_runtime_dependency_of_every_package():
    """Issue 40: the README's list lacked tqdm."""
    root = Path(__file__).resolve().parents[1]
    readme = (root / "README.md").read_text()
    first_party = {"ebmcore", "ebm-samplers", "ebm-losses", "ebm-cuda"}
    for pyproject in [root / "pyproject.toml", *sorted((root / "plugins").glob("*/pyproject.toml"))]:
        for requirement in tomllib.loads(pyproject.read_text())["project"]["dependencies"]:
            name = re.match(r"[A-Za-z0-9_.-]+", requirement).group(0)
            assert name in first_party or f"`{name}`" in readme, f"README.md does not name {name} ({pyproject})"
