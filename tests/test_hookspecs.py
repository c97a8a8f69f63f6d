"""The hook specs are the documented map of the system, and the builtins go through them."""

import inspect

import pluggy

from ebmcore import hookspecs, plugins

EXPECTED = {
    "ebm_register_energies",
    "ebm_register_samplers",
    "ebm_register_integrators",
    "ebm_register_losses",
    "ebm_register_kernels",
    "ebm_add_commands",
    "ebm_configure",
}


def test_every_hook_is_a_documented_function():
    specs = {n for n, f in vars(hookspecs).items() if n.startswith("ebm_") and inspect.isfunction(f)}
    assert specs == EXPECTED
    for name in specs:
        doc = inspect.getdoc(getattr(hookspecs, name))
        assert doc and len(doc) > 40, f"{name} needs a docstring saying when it is called and what it gets"


def test_configure_hook_is_historic():
    pm = pluggy.PluginManager("ebmcore")
    pm.add_hookspecs(hookspecs)
    assert pm.hook.ebm_configure.spec.opts["historic"] is True


def test_builtins_register_through_the_hooks_like_any_plugin():
    s = plugins.session()
    record = s.records["builtin"]
    assert record.status == "loaded" and record.distribution == "ebmcore"
    assert set(record.provides) == {"energy", "kernel"}
    impls = [i.plugin_name for i in s.manager.hook.ebm_register_energies.get_hookimpls()]
    assert "builtin" in impls


def test_configure_hook_receives_the_config(ebm_plugins):
    seen = []

    class Plugin:
        @hookspecs.hookimpl
        def ebm_configure(self, config):
            seen.append(config)

    import ebmcore

    ebmcore.register_plugin(Plugin(), "configured")
    assert seen == [ebm_plugins.config]
