"""The ebm command: plugins, backends, demo, version; help for every flag; commands of missing plugins."""

import argparse
import re
import shlex
import shutil
import subprocess
import sys
from importlib import metadata as importlib_metadata
from pathlib import Path

import pytest
import torch

import ebmcore
from ebmcore import plugins
from ebmcore.cli import _double_well_mean_abs, main
from ebmcore.testing import isolated_plugins


def test_version(capsys):
    assert main(["--version"]) == 0
    assert f"ebm {ebmcore.__version__}" in capsys.readouterr().out


def test_plugins_lists_the_builtin_plugin(capsys):
    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    assert "builtin" in out and "loaded" in out and "energy: gaussian" in out and "kernel: torch" in out


def test_backends_prints_the_resolution_table(capsys):
    assert main(["backends", "--device", "cpu", "--op", "gaussian_gradient"]) == 0
    out = capsys.readouterr().out
    assert "backend torch (ebmcore" in out and "available" in out
    assert "op gaussian_gradient on cpu (float32)" in out and "CHOSEN  torch" in out


def test_backends_on_a_cuda_machine_does_not_fail_for_ops_no_backend_offers_there(capsys, monkeypatch):
    """On the H100 `ebm backends` exited 1: the CPU-only fused ops (cpu_fused's) have no kernel on cuda:0, which is
    by design (their callers take another path), not a failure. Here every backend is made available on an sm_90."""
    from ebmcore import registry
    from ebmcore.kernels import resolve

    monkeypatch.setattr(resolve, "_capability", lambda device: (9, 0) if device.type == "cuda" else None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for entry in registry.entries("kernel"):
        monkeypatch.setattr(entry.component, "unavailable_reason", lambda: None)
    cpu_only = sorted(
        {op for e in registry.entries("kernel") for op, k in e.component.kernels.items() if "cuda" not in k.device_types}
        - {op for e in registry.entries("kernel") for op, k in e.component.kernels.items() if "cuda" in k.device_types}
    )
    assert cpu_only  # ops only a CPU backend offers (cpu_fused's)
    assert main(["backends", "--device", "cuda"]) == 0
    out = capsys.readouterr().out
    assert "have no kernel that can run" not in out
    assert "No installed backend offers " + ", ".join(f"{op} on cuda" for op in cpu_only) in out


def test_backends_with_a_bad_selection_is_a_clean_error(capsys, monkeypatch):
    monkeypatch.setenv("EBM_BACKEND", "cuda")
    with isolated_plugins(autoload=True, disable=("cuda",)):  # as if ebm-cuda were not installed
        assert main(["backends", "--device", "cpu"]) == 2
    assert "pip install ebm-cuda" in capsys.readouterr().err


def test_demo_samples_the_double_well(capsys):
    assert main(["demo", "--n-chains", "4000", "--n-steps", "300", "--step-size", "0.01"]) == 0
    out = capsys.readouterr().out
    sampled = float(out.split("E|x_i|: sampled ")[1].split(",")[0])
    # 4000 chains x 2 coordinates: the standard error of E|x| is ~0.005; ULA's O(h) bias at h=0.01 is ~0.01.
    assert abs(sampled - _double_well_mean_abs()) < 0.04


def test_console_script_is_installed():
    exe = shutil.which("ebm") or str(__import__("pathlib").Path(sys.executable).with_name("ebm"))
    result = subprocess.run([exe, "--version"], capture_output=True, text=True, check=True)
    assert result.stdout.startswith("ebm ")


def _parsers(parser, path="ebm"):
    """Every (command path, parser) of ebm, subcommands of subcommands included."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, f"{path} {name}")


def test_every_flag_and_argument_of_every_command_has_help():
    from ebmcore import cli

    seen, missing = set(), []
    for path, parser in _parsers(cli._parser()):
        seen.add(path)
        missing += [
            f"{path} {a.option_strings or a.dest}"
            for a in parser._actions
            if not isinstance(a, argparse._SubParsersAction) and not (a.help or "").strip()
        ]
    assert {"ebm sample", "ebm train", "ebm profile", "ebm cuda info", "ebm demo"} <= seen
    assert missing == []


@pytest.mark.parametrize("command, dist", [("train", "ebm-losses"), ("sample", "ebm-samplers"), ("profile", "ebm-samplers")])
def test_a_command_of_a_missing_plugin_says_what_to_install(monkeypatch, capsys, command, dist):
    real = importlib_metadata.entry_points
    monkeypatch.setattr(
        importlib_metadata,
        "entry_points",  # as if the plugin were not installed
        lambda **kw: [ep for ep in real(**kw) if not (ep.dist and ep.dist.name == dist)],
    )
    plugins.reset()
    assert main([command, "--out", "x", "--steps", "3"]) == 2
    err = capsys.readouterr().err
    assert f"error: `ebm {command}` is provided by the plugin {dist}, which is not installed" in err
    checkout = Path(__file__).resolve().parents[1] / "plugins" / dist.replace("-", "_")  # ebm runs from this checkout
    assert f"install it from this checkout with `pip install -e {checkout}` (where it is published: `pip install {dist}`)" in err
    assert not Path("x").exists()


def test_a_command_of_a_blocked_plugin_says_so(monkeypatch, capsys):
    monkeypatch.setenv("EBM_DISABLE_PLUGINS", "losses")
    ebmcore.reload_config()
    assert main(["train", "--help"]) == 2
    assert (
        "ebm-losses, which is installed but blocked: its plugin 'losses' is named by EBM_DISABLE_PLUGINS"
        in capsys.readouterr().err
    )


def test_the_validation_examples_of_cli_md_print_what_ebm_prints(tmp_path, monkeypatch, capsys):
    page = (Path(__file__).resolve().parents[1] / "docs" / "cli.md").read_text()
    monkeypatch.chdir(tmp_path)
    for name, text in re.findall(r"```toml\n# (\S+\.toml)\n(.*?)```", page, re.S):
        (tmp_path / name).write_text(text)
    sample, train = (tmp_path / "sample.toml").read_text(), (tmp_path / "train.toml").read_text()
    bad = {  # what the comments in the block say each file changes
        "bad1.toml": sample.replace("n_chains = 200", "n_chain = 10"),
        "bad2.toml": sample.replace("target_accept = 0.6", "target_accept = 1"),
        "bad4.toml": sample.replace("[energy]\n", '[energy]\nmodel = "m.pt"\n'),
        "bad8.toml": sample + "\n[extra]\na = 1\n",
        "bad9.toml": sample.replace("[sampler]\n", "[sampler]\nparams = { stepsize = 0.1 }\n"),
        "train-bad1.toml": train.replace('dataset = "eight_gaussians"', 'dataset = "moons"'),
        "train-bad2.toml": train.replace("ema_decay = 0.9", "ema_decay = 1"),
    }
    for name, text in bad.items():
        (tmp_path / name).write_text(text)
    block = page.split("## Validation and errors")[1].split("```\n")[1]
    examples = re.findall(r"^\$ (ebm [^\n#]*?)\s*(?:#[^\n]*)?\n(error: [^\n]*)$", block, re.M)
    assert len(examples) >= 12
    for command, printed in examples:
        capsys.readouterr()
        assert main(shlex.split(command)[1:]) == 2, command
        assert capsys.readouterr().err.strip() == printed, command


def test_python_m_ebmcore_works_like_ebm(capsys):
    bad = subprocess.run([sys.executable, "-m", "ebmcore", "backends", "--device", "cpu:x"], capture_output=True, text=True)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr  # ebm's exit status and message
    assert main(["backends", "--device", "cpu:x"]) == 2
    assert bad.stderr == capsys.readouterr().err and bad.stderr.startswith("error: ")


def test_quiet_and_verbose_set_the_level_of_the_library_messages(tmp_path, capsys):
    import logging

    from ebmcore import logs

    config = tmp_path / "s.toml"
    config.write_text(
        '[energy]\nname = "gaussian"\nparams = { dim = 2 }\n[sampler]\nname = "mala"\nn_chains = 8\n'
        'n_steps = 4\nburn_in = 0\nwarmup = 4\n[output]\nplots = false\ndraws = "none"\n'
    )

    def stderr(*flags):  # a run directory each: a finished run would not run again
        assert main([*flags, "sample", str(config), "--out", str(tmp_path / f"o{''.join(flags)}")]) == 0
        return capsys.readouterr().err

    default, quiet, verbose = stderr(), stderr("--quiet"), stderr("-v")
    assert "warm-up: 4 steps, acceptance" in default and "MALASampler: 8 chains" not in default  # INFO, not DEBUG
    assert quiet == ""
    assert "warm-up: 4 steps" in verbose and "MALASampler: 8 chains of shape (2,), per-step loop" in verbose
    assert main(["sample", str(config), "--out", str(tmp_path / "o-sub"), "--quiet"]) == 0  # the subcommand's --quiet too
    assert capsys.readouterr().err == ""
    # one logger per package, named after it: the core's and every plugin's
    assert {"ebmcore", "ebm_samplers", "ebm_losses", "ebm_cuda"} <= set(logs.package_loggers())
    assert logging.getLogger("ebm_samplers").getEffectiveLevel() == logging.WARNING


@pytest.mark.skipif(torch.version.cuda is not None, reason="the page shows the listing of a CPU-only torch build")
def test_the_backends_listing_of_backends_md_is_what_ebm_prints(capsys):
    page = (Path(__file__).resolve().parents[1] / "docs" / "backends.md").read_text()
    shown = page.split("    $ ebm backends\n", 1)[1].split("    ```", 1)[0]
    capsys.readouterr()
    main(["backends"])
    printed = capsys.readouterr().out
    assert [line.removeprefix("    ") for line in shown.rstrip("\n").split("\n")] == printed.rstrip("\n").split("\n")
