"""The ebm command: plugins, backends, demo, version."""

import shutil
import subprocess
import sys

import ebmcore
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


def test_python_m_ebmcore_works_like_ebm(capsys):
    bad = subprocess.run([sys.executable, "-m", "ebmcore", "backends", "--device", "cpu:x"], capture_output=True, text=True)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr  # ebm's exit status and message
    assert main(["backends", "--device", "cpu:x"]) == 2
    assert bad.stderr == capsys.readouterr().err and bad.stderr.startswith("error: ")


def test_quiet_and_verbose_set_the_level_of_the_library_messages(tmp_path, capsys):
    import logging

    from ebmcore import logs

    config = tmp_path / "s.toml"
    config.write_text('[energy]\nname = "gaussian"\nparams = { dim = 2 }\n[sampler]\nname = "mala"\nn_chains = 8\n'
                      'n_steps = 4\nburn_in = 0\nwarmup = 4\n[output]\nplots = false\ndraws = "none"\n')

    def stderr(*flags):
        assert main([*flags, "sample", str(config), "--out", str(tmp_path / "o")]) == 0
        return capsys.readouterr().err

    default, quiet, verbose = stderr(), stderr("--quiet"), stderr("-v")
    assert "warm-up: 4 steps, acceptance" in default and "MALASampler: 8 chains" not in default  # INFO, not DEBUG
    assert quiet == ""
    assert "warm-up: 4 steps" in verbose and "MALASampler: 8 chains of shape (2,), per-step loop" in verbose
    assert main(["sample", str(config), "--out", str(tmp_path / "o"), "--quiet"]) == 0  # the subcommand's --quiet too
    assert capsys.readouterr().err == ""
    # one logger per package, named after it: the core's and every plugin's
    assert {"ebmcore", "ebm_samplers", "ebm_losses", "ebm_cuda"} <= set(logs.package_loggers())
    assert logging.getLogger("ebm_samplers").getEffectiveLevel() == logging.WARNING
