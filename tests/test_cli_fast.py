"""``ebm``, ``ebm --help`` and ``ebm --version`` (issue 29), and ``ebm COMMAND --help`` for every command (issue 40),
answer without importing torch or a plugin, and print exactly what the whole parser, plugins loaded, prints: the
subcommands and their arguments come from what each plugin declares in the entry-point group ``ebmcore.commands``
(:mod:`ebmcore.commands`)."""

import importlib.metadata as importlib_metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest

import ebmcore
from ebmcore import cli, plugins
from ebmcore.testing import installed_distribution
from ebmcore.testing.plugins import environment_plugins

CONFIGURATIONS = {  # name -> (environment, distribution hidden as if not installed)
    "every plugin": ({}, None),
    "one blocked": ({"EBM_DISABLE_PLUGINS": "losses"}, None),
    "autoload off": ({"EBM_DISABLE_PLUGIN_AUTOLOAD": "1"}, None),
    "ebm-cuda not installed": ({}, "ebm-cuda"),
}


def _fast(argv, capsys):
    """What ``main(argv)`` prints and returns in a fresh process's state (no plugin loaded), and that it loaded none."""
    plugins.reset()
    try:
        status = cli.main(argv)
    except SystemExit as exc:  # --help: argparse exits 0
        status = exc.code
    assert not plugins.loaded(), f"ebm {' '.join(argv)} loaded the plugins"
    return capsys.readouterr().out, status


@pytest.mark.parametrize("configuration", CONFIGURATIONS)
def test_the_fast_help_and_version_are_the_whole_parsers_line_by_line(configuration, monkeypatch, capsys):
    environment, hidden = CONFIGURATIONS[configuration]
    monkeypatch.setenv("COLUMNS", "100")  # argparse wraps to the terminal: the same width for both
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    ebmcore.reload_config()
    if hidden:
        real = importlib_metadata.entry_points
        monkeypatch.setattr(
            importlib_metadata, "entry_points", lambda **kw: [ep for ep in real(**kw) if not (ep.dist and ep.dist.name == hidden)]
        )

    fast_help, status = _fast(["--help"], capsys)
    assert status == 0
    assert _fast([], capsys) == (fast_help, 2)  # `ebm` alone prints the help and exits 2
    fast_version, status = _fast(["--version"], capsys)
    assert status == 0

    plugins.reset()
    whole_help = cli._parser().format_help()
    assert plugins.loaded()
    assert fast_help.splitlines() == whole_help.splitlines()
    assert cli.main(["--version"]) == 0  # the plugins are loaded now: the whole parser answers
    assert fast_version == capsys.readouterr().out

    if configuration == "every plugin":  # what docs/cli.md shows
        for command in ("sample", "profile", "train", "cuda"):
            assert any(line.split()[:1] == [command] for line in fast_help.splitlines())
        assert fast_version.startswith("ebm 0.1.0 (torch ") and fast_version.endswith(
            "; plugins: ebm-samplers 0.1.0, ebm-losses 0.1.0, ebm-cuda 0.1.0)\n"
        )
    if configuration == "ebm-cuda not installed":  # the command of an uninstalled first-party plugin, and its hint
        assert "    cuda                (not available: needs the plugin ebm-cuda)" in fast_help.splitlines()
        assert "ebm-cuda" not in fast_version
    if configuration == "autoload off":
        assert fast_version.endswith("; plugins: none)\n")


SUBCOMMANDS = [
    ["sample"],
    ["train"],
    ["profile"],
    ["cuda"],
    ["cuda", "info"],
    ["cuda", "build"],
    ["plugins"],
    ["backends"],
    ["demo"],
]


@pytest.mark.parametrize("command", SUBCOMMANDS, ids=" ".join)
def test_a_commands_fast_help_is_the_whole_parsers_line_by_line(command, monkeypatch, capsys):
    """Issue 40: `ebm sample --help` (and every command's) imported torch and the plugins (2-6 s); the arguments are
    declared beside the one-line help (ARGUMENTS in the plugins' commands.py), and the text is the same."""
    monkeypatch.setenv("COLUMNS", "100")
    fast_help, status = _fast([*command, "--help"], capsys)
    assert status == 0 and fast_help.startswith(f"usage: ebm {' '.join(command)} [-h]")
    plugins.reset()
    with pytest.raises(SystemExit) as exit_:
        cli._parser().parse_args([*command, "--help"])
    assert exit_.value.code == 0 and plugins.loaded()
    assert fast_help.splitlines() == capsys.readouterr().out.splitlines()


def test_the_declared_arguments_hold_what_the_implementations_check():
    from ebm_losses.train_job import bundled_config_names
    from ebm_samplers import draws
    from ebm_samplers.commands import DRAWS_FORMATS

    assert DRAWS_FORMATS == tuple(draws.FORMATS)
    assert {"default", "digits", "cifar10"} <= set(bundled_config_names())


@pytest.mark.parametrize(
    "argv, error",
    [
        (["sample", "--n-chains", "x", "--help"], "argument --n-chains: invalid int value: 'x'"),  # before --help: an error
        (["cuda", "frob", "--help"], "argument cuda_command: invalid choice: 'frob'"),
    ],
)
def test_an_error_before_the_help_is_the_whole_parsers(argv, error, capsys):
    plugins.reset()
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    fast = capsys.readouterr().err
    assert exit_.value.code == 2 and error in fast and not plugins.loaded()
    with pytest.raises(SystemExit):
        cli._parser().parse_args(argv)
    assert capsys.readouterr().err == fast


def test_the_help_of_a_blocked_plugins_command_is_the_whole_parsers(monkeypatch, capsys):
    monkeypatch.setenv("EBM_DISABLE_PLUGINS", "losses")
    ebmcore.reload_config()
    plugins.reset()
    assert cli.main(["train", "--help"]) == 2
    assert "error: `ebm train` is provided by the plugin ebm-losses, which is installed but blocked" in capsys.readouterr().err
    assert plugins.loaded()  # the declared parser parsed `--help` as an argument of the unavailable command


def test_help_and_version_import_neither_torch_nor_a_plugin():
    commands = [[*command, "--help"] for command in SUBCOMMANDS]
    code = (
        "import sys\n"
        "from ebmcore.cli import main\n"
        f"for argv, expected in ([], 2), (['--help'], 0), (['--version'], 0), *[(c, 0) for c in {commands!r}]:\n"
        "    try:\n"
        "        status = main(argv)\n"
        "    except SystemExit as exc:\n"
        "        status = exc.code\n"
        "    assert status == expected, (argv, status)\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'ebm_samplers', 'ebm_losses', 'ebm_cuda'))\n"
        "assert loaded == [], loaded[:10]\n"
    )
    env = dict(os.environ, COLUMNS="200")  # no wrapping
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert run.returncode == 0, run.stderr
    assert "sample an energy with any registered sampler" in run.stdout and "ebm-cuda 0.1.0" in run.stdout
    assert "usage: ebm train [-h]" in run.stdout and "the name of a bundled one: cifar10, default, digits" in run.stdout


def test_the_console_script_prints_the_version_line():
    script = Path(sys.executable).parent / "ebm"
    if not script.exists():
        pytest.skip("no ebm script beside this Python")
    run = subprocess.run([str(script), "--version"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    torch_version = importlib_metadata.version("torch")
    head, listed = run.stdout.rstrip(")\n").split("; plugins: ")
    others = environment_plugins()  # a user's third-party plugins (docs/plugins.md's example, say)
    ours = [p for p in listed.split(", ") if p.split(" ")[0] not in others]
    assert (head, ours) == (f"ebm 0.1.0 (torch {torch_version}", ["ebm-samplers 0.1.0", "ebm-losses 0.1.0", "ebm-cuda 0.1.0"])


HELLO = """
import ebmcore

@ebmcore.hookimpl
def ebm_add_commands(subparsers):
    subparsers.add_parser("hello", help="a command of its own").set_defaults(func=lambda args: 0)
"""

HELLO_DECLARED = {
    "hello.py": HELLO,
    "hello_meta/__init__.py": "raise RuntimeError('the package of a declaration is not imported by ebm --help')\n",
    "hello_meta/commands.py": "COMMANDS = {'hello': 'a command of its own'}\n",
}


def test_a_command_added_only_through_the_hook_still_shows_in_the_help(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "100")
    with installed_distribution(tmp_path, "hello-plugin", "1.0", {"hello": "hello"}, {"hello.py": HELLO}):
        plugins.reset()
        with pytest.raises(SystemExit):
            cli.main(["--help"])
        assert plugins.loaded()  # no declaration: the whole parser answered
        assert "    hello               a command of its own" in capsys.readouterr().out.splitlines()
        assert cli.main(["hello"]) == 0


def test_a_declared_third_party_command_is_in_the_fast_help(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "100")
    with installed_distribution(
        tmp_path, "hello-plugin", "1.0", {"hello": "hello"}, HELLO_DECLARED, commands={"hello": "hello_meta.commands:COMMANDS"}
    ):
        fast_help, status = _fast(["--help"], capsys)
        assert status == 0 and "hello_meta" not in sys.modules
        assert "    hello               a command of its own" in fast_help.splitlines()
        assert "hello-plugin 1.0" in _fast(["--version"], capsys)[0]
        plugins.reset()
        assert fast_help.splitlines() == cli._parser().format_help().splitlines()
        assert cli.main(["hello"]) == 0


def test_a_declaration_that_cannot_be_read_leaves_the_help_to_the_whole_parser(tmp_path, capsys):
    with installed_distribution(
        tmp_path, "hello-plugin", "1.0", {"hello": "hello"}, {"hello.py": HELLO}, commands={"hello": "hello_missing:COMMANDS"}
    ):
        plugins.reset()
        with pytest.raises(SystemExit):
            cli.main(["--help"])
        assert plugins.loaded() and "a command of its own" in capsys.readouterr().out


EXITS = "import sys\nsys.exit(7)\n"


@pytest.mark.parametrize(
    "files, declaration",
    [
        ({"hello.py": HELLO, "hello_meta.py": EXITS}, "hello_meta:COMMANDS"),  # the declaration alone exits
        ({"hello.py": EXITS + HELLO}, "hello:COMMANDS"),  # the plugin itself exits: it is recorded as failed
    ],
    ids=["declaration", "plugin"],
)
def test_a_plugin_calling_sys_exit_at_import_does_not_end_the_help_and_is_named(tmp_path, capsys, files, declaration):
    with installed_distribution(tmp_path, "hello-plugin", "1.0", {"hello": "hello"}, files, commands={"hello": declaration}):
        plugins.reset()
        with pytest.raises(SystemExit) as exit_:
            cli.main(["--help"])
        out, err = capsys.readouterr()
        assert exit_.value.code == 0 and "usage: ebm" in out and plugins.loaded()  # the whole parser answered
        assert (
            f"warning: plugin 'hello' (hello-plugin): its command declaration {declaration} cannot be read (SystemExit: 7)"
        ) in err
        record = plugins.session().records["hello"]
        if "hello_meta" in declaration:
            assert record.status == "loaded" and "a command of its own" in out
        else:
            assert record.status == "failed" and record.error == "import: SystemExit: 7"


def test_a_keyboard_interrupt_in_a_declaration_still_interrupts(tmp_path, capsys):
    with installed_distribution(
        tmp_path,
        "hello-plugin",
        "1.0",
        {"hello": "hello"},
        {"hello.py": HELLO, "hello_meta.py": "raise KeyboardInterrupt\n"},
        commands={"hello": "hello_meta:COMMANDS"},
    ):
        plugins.reset()
        with pytest.raises(KeyboardInterrupt):
            cli._fast(["--help"])  # not taken for a broken declaration
        assert cli.main(["--help"]) == 130  # the command line says so in one line (issue 40)
        assert capsys.readouterr().err == f"{cli._INTERRUPTED}\n"


def test_a_declared_command_of_a_plugin_that_fails_to_import_names_the_plugin(tmp_path, monkeypatch, capsys):
    """Issue 40: `ebm frobnicate`, listed by `ebm --help` from the declaration of a plugin that then fails to import,
    was argparse's "invalid choice" naming no plugin; it names the plugin, its import failure and the fix."""
    monkeypatch.setenv("COLUMNS", "100")
    files = {
        "frob.py": "raise ImportError('no module named frobnicate_backend')\n",
        "frob_meta.py": "COMMANDS = {'frobnicate': 'frobnicate things'}\n",
    }
    with installed_distribution(tmp_path, "frob-plugin", "1.0", {"frob": "frob"}, files, commands={"frob": "frob_meta:COMMANDS"}):
        fast_help, _ = _fast(["--help"], capsys)
        assert any(line.split()[:1] == ["frobnicate"] for line in fast_help.splitlines())
        plugins.reset()
        assert fast_help.splitlines() == cli._parser().format_help().splitlines()
        plugins.reset()
        with pytest.raises(
            ebmcore.errors.UnknownComponentError,
            match=r"`ebm frobnicate` is provided by the plugin frob-plugin, which failed to load "
            r"\(.*no module named frobnicate_backend.*\); fix or reinstall it",
        ):
            cli._parser().parse_args(["frobnicate"]).func(None)


def test_ctrl_c_while_torch_and_the_plugins_import_is_one_line_and_status_130(tmp_path):
    """Issue 40: Ctrl-C in the first seconds of `ebm sample` (torch and the plugins importing) was a traceback, or,
    where the library being imported caught the KeyboardInterrupt, a plugin that "failed to load" or a run that went
    on; it ends the process with the one line and status 130, writing nothing."""
    out = tmp_path / "run"
    code = (
        "import os, signal, sys\n"
        "from ebmcore import cli\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)  # a background job inherits SIGINT ignored\n"
        "real = cli._parser\n"
        "def parser():\n"
        "    try:\n"
        "        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C as torch and the plugins import\n"
        "    except BaseException:\n"
        "        pass  # as a library whose import catches the KeyboardInterrupt\n"
        "    return real()\n"
        "cli._parser = parser\n"
        f"sys.argv = ['ebm', 'sample', '--out', {str(out)!r}]\n"
        "sys.exit(cli.main())\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert (run.returncode, run.stderr, run.stdout) == (130, f"{cli._INTERRUPTED}\n", "")
    assert not out.exists()


HELLO_WITH_ARGUMENTS = """
import ebmcore

@ebmcore.hookimpl
def ebm_add_commands(subparsers):
    p = subparsers.add_parser("hello", help="a command of its own")
    p.add_argument("--times", type=int, help="how many times")
    p.set_defaults(func=lambda args: 0)
"""


@pytest.mark.parametrize("broken", [False, True], ids=["declared", "raising"])
def test_a_third_party_commands_declared_arguments_give_its_fast_help(tmp_path, monkeypatch, capsys, broken):
    monkeypatch.setenv("COLUMNS", "100")
    body = "    raise RuntimeError('boom')\n" if broken else "    p.add_argument('--times', type=int, help='how many times')\n"
    files = {
        "hello.py": HELLO_WITH_ARGUMENTS,
        "hello_meta/__init__.py": HELLO_DECLARED["hello_meta/__init__.py"],
        "hello_meta/commands.py": f"COMMANDS = {{'hello': 'a command of its own'}}\ndef hello(p):\n{body}ARGUMENTS = {{'hello': hello}}\n",
    }
    with installed_distribution(
        tmp_path, "hello-plugin", "1.0", {"hello": "hello"}, files, commands={"hello": "hello_meta.commands:COMMANDS"}
    ):
        plugins.reset()
        with pytest.raises(SystemExit) as exit_:
            cli.main(["hello", "--help"])
        out, err = capsys.readouterr()
        assert exit_.value.code == 0 and "  --times TIMES  how many times" in out.splitlines()
        assert plugins.loaded() == broken and "hello_meta" not in sys.modules
        if broken:  # named, and the whole parser answered
            assert "warning: plugin 'hello' (hello-plugin): its declared arguments of `ebm hello` cannot be added" in err
        else:
            plugins.reset()
            with pytest.raises(SystemExit):
                cli._parser().parse_args(["hello", "--help"])
            assert capsys.readouterr().out.splitlines() == out.splitlines()
