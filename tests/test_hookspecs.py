"""The hook specs are the documented map of the system, and the builtins go through them."""

import inspect

import pluggy

from ebmcore import hookspecs, plugins

EXPECTED = {
    "ebm_register_energies",
    "ebm_register_samplers",
    "ebm_register_integrators",
    "ebm_register_losses",
    "ebm_register_ops",
    "ebm_register_kernels",
    "ebm_add_commands",
}


def test_every_hook_is_a_documented_function():
    specs = {n for n, f in vars(hookspecs).items() if n.startswith("ebm_") and inspect.isfunction(f)}
    assert specs == EXPECTED
    for name in specs:
        doc = inspect.getdoc(getattr(hookspecs, name))
        assert doc and len(doc) > 40, f"{name} needs a docstring saying when it is called and what it gets"


def test_no_hook_spec_is_historic_or_firstresult():
    # pluggy calls each plugin's hooks for that plugin alone: tryfirst/trylast/historic would mean nothing
    pm = pluggy.PluginManager("ebmcore")
    pm.add_hookspecs(hookspecs)
    for name in EXPECTED:
        opts = getattr(pm.hook, name).spec.opts
        assert not opts.get("historic") and not opts.get("firstresult"), name


def test_builtins_register_through_the_hooks_like_any_plugin():
    s = plugins.session()
    record = s.records["builtin"]
    assert record.status == "loaded" and record.distribution == "ebmcore"
    assert set(record.provides) == {"energy", "op", "kernel"}
    impls = [i.plugin_name for i in s.manager.hook.ebm_register_energies.get_hookimpls()]
    assert "builtin" in impls


def test_the_builtin_plugin_is_an_entry_point_of_the_core_distribution():
    from importlib import metadata as importlib_metadata

    (ep,) = [ep for ep in importlib_metadata.entry_points(group="ebmcore") if ep.name == "builtin"]
    assert ep.value == "ebmcore.builtin" and ep.dist.name == "ebmcore"


def test_a_raising_hook_of_one_plugin_does_not_stop_the_next_plugin(ebm_plugins):
    import ebmcore

    class Broken:
        @hookspecs.hookimpl
        def ebm_register_energies(self, registry):
            raise RuntimeError("boom")

    class Fine:
        @hookspecs.hookimpl
        def ebm_register_energies(self, registry):
            registry.register_energy("fine_energy", ebmcore.HarmonicEnergy)

    assert ebmcore.register_plugin(Broken(), "broken").status == "failed"
    assert ebmcore.register_plugin(Fine(), "fine").status == "loaded"
    assert ebmcore.registry.get("energy", "fine_energy").plugin == "fine"
