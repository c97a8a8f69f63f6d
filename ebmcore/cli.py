"""The ``ebm`` command (also ``python -m ebmcore``): ``ebm plugins``, ``ebm backends``, ``ebm demo``, ``ebm --version``,
and the subcommands plugins add through ``ebm_add_commands`` (``ebm train``, ``ebm sample``, ``ebm profile``).
``--quiet``/``--verbose`` set the level of the library messages it shows (:mod:`ebmcore.logs`).

``ebm``, ``ebm --help``, ``ebm --version`` and ``ebm COMMAND --help`` import neither torch nor any plugin: the parser
they need is the core's plus the subcommands the plugins declare, with their arguments (:mod:`ebmcore.commands`),
and the versions come from the installed metadata. Every other command line builds the whole parser, plugins loaded,
as :func:`_parser` does; Ctrl-C meanwhile ends the process with one line and status 130."""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.metadata
import logging
import math
import os
import signal
import sys
import time
import warnings
from typing import Any, Iterator, Sequence

import ebmcore
from ebmcore import commands, config, logs, plugins, registry
from ebmcore.components import FIRST_PARTY_DISTRIBUTIONS, declared_plugins, install_hint
from ebmcore.config import parse_device
from ebmcore.errors import EBMError, UnknownComponentError

__all__ = ["main"]

_DTYPES = ("bfloat16", "float16", "float32", "float64")  # names of torch dtypes (torch is imported by the commands)


def _cmd_plugins(args: argparse.Namespace) -> int:
    s = plugins.session()
    print(f"configuration: {s.config.source}; autoload {'off' if s.config.disable_plugin_autoload else 'on'}")
    for record in s.records.values():
        provides = "; ".join(f"{k}: {', '.join(v)}" for k, v in record.provides.items()) or "-"
        origin = f"{record.distribution} {record.version}"
        print(f"{record.name:<20} {origin:<24} {record.status:<8} {provides}")
        if record.error:
            print(f"{'':<20} error: {record.error}")
        if args.verbose and record.traceback:
            print(record.traceback)
    for kind, name, found in s.table.conflicts():
        print(f"CONFLICT {kind} '{name}': " + "; ".join(f"{e.plugin} ({e.distribution} {e.version})" for e in found))
    for kind, name, winner, losers in s.table.shadowed():
        why = "override=True" if winner.override else "first-party"
        print(
            f"SHADOWED {kind} '{name}': {winner.plugin} ({winner.distribution}, {why}) is used; not "
            + ", ".join(f"{e.plugin} ({e.distribution})" for e in losers)
        )
    for command, winner, loser in s.command_clashes:
        print(f"SHADOWED command '{command}': {winner} is used; not {loser}")
    return 1 if s.failures() or s.table.conflicts() else 0


def _devices() -> list[Any]:
    import torch

    devices = [torch.device("cpu")]
    if torch.cuda.is_available():
        devices += [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
    return devices


def _cmd_backends(args: argparse.Namespace) -> int:
    import torch

    for entry in registry.entries("kernel"):
        reason = entry.component.unavailable_reason()
        state = "available" if reason is None else f"unavailable: {reason}"
        print(f"backend {entry.name} ({entry.distribution} {entry.version}): {state}")
    ops = sorted({op for e in registry.entries("kernel") for op in e.component.kernels})
    if args.op:
        ops = [args.op]
    devices = [parse_device(args.device, "--device")] if args.device else _devices()
    unresolved, not_offered = 0, []
    for device in devices:
        for op in ops:
            why = ebmcore.explain(op, device=device, dtype=getattr(torch, args.dtype))
            if why.chosen is None and not _offered(op, device):
                not_offered.append(f"{op} on {device.type}")
            else:
                unresolved += why.chosen is None
            print()
            print(why)
    print(
        "\nneural energies (an EnergyModel without an analytic gradient): the gradient is computed in closed form, "
        "equal to autograd's, when the energy's program is a feed-forward network (MLPEnergy, SequentialEnergy: "
        "nn.Linear layers and activations ending in Linear(·, 1); ebmcore.energies.feedforward); otherwise by autograd. A backend may run such a network itself: "
        "the feedforward_* ops above (ebm-cuda's cpu_fused: ULA chains, and the fused ops of the losses; its triton backend: "
        "ULA chains on CUDA, and the losses' fused op of the same chain). On CUDA, where no fused chain runs, "
        "ebm-samplers replays its per-step loop as a captured CUDA graph (docs/samplers.md). A sampler's run "
        "names the path it takes and why (ebm profile prints it)."
    )
    if not_offered:
        print(
            f"\nNo installed backend offers {', '.join(not_offered)}: where an op is not offered, its callers take "
            "another path (the per-step loop, autograd), named in a run's path."
        )
    if unresolved:
        print(f"\n{unresolved} op(s) have no kernel that can run under this selection.")
    return 1 if unresolved else 0


def _offered(op: str, device: Any) -> bool:
    """Whether a registered backend has a kernel for ``op`` on ``device``'s type (available here or not)."""
    return any(
        op in e.component.kernels and device.type in e.component.kernels[op].device_types for e in registry.entries("kernel")
    )


def _double_well_mean_abs() -> float:
    """E|x| under p(x) ∝ exp(-(x²-1)²), by the trapezoidal rule (the exact reference for the demo)."""
    import torch

    xs = torch.linspace(-4, 4, 20001, dtype=torch.float64)
    w = torch.exp(-((xs * xs - 1) ** 2))
    return float(torch.trapezoid(xs.abs() * w, xs) / torch.trapezoid(w, xs))


def _cmd_demo(args: argparse.Namespace) -> int:
    """Unadjusted Langevin on a 2-d double well with the core's energy and kernel dispatch."""
    import torch

    energy = ebmcore.energy("double_well", dim=2)
    g = torch.Generator().manual_seed(args.seed)
    x = torch.randn(args.n_chains, 2, generator=g)
    h = args.step_size
    print(ebmcore.explain("double_well_gradient", x))
    gradient = ebmcore.resolve_kernel("double_well_gradient", x.device, x.dtype).fn  # resolved once, outside the loop
    noise = torch.empty_like(x)
    start = time.perf_counter()
    for _ in range(args.n_steps):
        noise.normal_(generator=g)
        x.add_(gradient(x, energy.barrier), alpha=-h).add_(noise, alpha=math.sqrt(2 * h))
    elapsed = time.perf_counter() - start
    expected = _double_well_mean_abs()
    got = float(x.abs().mean())
    right = float((x[:, 0] > 0).double().mean())
    print(
        f"\n{args.n_chains} chains × {args.n_steps} Langevin steps (h={h}) in {elapsed:.2f} s "
        f"({args.n_chains * args.n_steps / elapsed / 1e6:.1f} M chain-steps/s)"
    )
    print(
        f"E|x_i|: sampled {got:.3f}, exact {expected:.3f} (ULA bias O(h)); "
        f"fraction in the right-hand well: {right:.3f} (exact 0.5)"
    )
    print("Samplers, losses and CUDA kernels come from plugins: see `ebm plugins`.")
    return 0


def _cmd_version(args: argparse.Namespace) -> int:
    import torch

    s = plugins.session()
    extra = ", ".join(f"{r.distribution} {r.version}" for r in s.records.values() if r.distribution != "ebmcore")
    print(f"ebm {ebmcore.__version__} (torch {torch.__version__}; plugins: {extra or 'none'})")
    return 0


def _core_parser() -> tuple[argparse.ArgumentParser, Any]:
    """The parser with the core's options and subcommands, and its sub-parsers object for the plugins' commands."""
    parser = argparse.ArgumentParser(prog="ebm", description="ebm: energy-based models in PyTorch")
    parser.add_argument("--version", action="store_true", help="print the versions of ebmcore, torch and the plugins")
    parser.add_argument(
        "-q",
        "--quiet",
        dest="log_level",
        action="store_const",
        const=logging.WARNING,
        help="show warnings and errors only (a subcommand's own --quiet does too)",
    )
    parser.add_argument(
        "-v",
        "--verbose",
        dest="log_level",
        action="store_const",
        const=logging.DEBUG,
        help="show debug messages too (which loop or kernel runs, and why)",
    )
    parser.set_defaults(log_level=logging.INFO)
    sub = parser.add_subparsers(dest="command")
    p = sub.add_parser("plugins", help="list plugins, what they provide, and any failure")
    p.add_argument("-v", "--verbose", action="store_true", help="show tracebacks of failed plugins")
    p.set_defaults(func=_cmd_plugins)
    p = sub.add_parser("backends", help="show which kernel backend each op resolves to on this machine, and why")
    p.add_argument("--device", help="a device such as cpu or cuda:0 (default: every device here)")
    p.add_argument("--dtype", default="float32", choices=sorted(_DTYPES), help="dtype of the inputs (default: float32)")
    p.add_argument("--op", help="only this op (default: every op of the registered backends)")
    p.set_defaults(func=_cmd_backends)
    p = sub.add_parser("demo", help="a short Langevin run on a double well with the core's pieces")
    p.add_argument("--n-chains", type=int, default=10_000, help="number of chains (default: 10000)")
    p.add_argument("--n-steps", type=int, default=500, help="Langevin steps (default: 500)")
    p.add_argument("--step-size", type=float, default=0.01, help="Langevin step size h (default: 0.01)")
    p.add_argument("--seed", type=int, default=0, help="seed of the generator (default: 0)")
    p.set_defaults(func=_cmd_demo)
    return parser, sub


def _parser() -> argparse.ArgumentParser:
    """The whole parser: the core's, and the subcommands the loaded plugins add through ``ebm_add_commands``."""
    parser, sub = _core_parser()
    plugins.session().add_commands(sub)
    _add_missing_commands(sub)
    _add_failed_plugins_commands(sub)
    return parser


def _add_failed_plugins_commands(sub: Any) -> None:
    """A subcommand for each command that a plugin which failed to load declares (:mod:`ebmcore.commands`), with
    its declared help (as the fast ``ebm --help`` lists it): running it says which plugin, why, and the fix, where
    argparse would say only "invalid choice"."""
    for record in plugins.session().records.values():
        if record.status != "failed":
            continue
        declared, _ = commands.read_declaration(record.name, record.distribution)
        for command, line in (declared or {}).items():
            if command not in sub.choices:
                p = sub.add_parser(command, help=line, add_help=False, prefix_chars="\0")
                p.add_argument("args", nargs="*", help="ignored")
                p.set_defaults(func=functools.partial(_missing_command, command, record.distribution))


def _add_missing_commands(sub: Any) -> None:
    """A subcommand for each command of a first-party plugin of the checkout that no loaded plugin added."""
    for dist, (_, provided) in declared_plugins().items():  # a checkout's command whose plugin is missing: what to install
        for command in provided.get("command", ()):
            if command not in sub.choices:
                p = sub.add_parser(command, help=f"(not available: needs the plugin {dist})", add_help=False, prefix_chars="\0")
                p.add_argument("args", nargs="*", help="ignored")
                p.set_defaults(func=functools.partial(_missing_command, command, dist))


def _plugin_entry_points(cfg: Any) -> list[tuple[str, str, str, bool]] | None:
    """``(name, distribution, version, blocked)`` of each plugin entry point, in the order and with the skips of
    :meth:`ebmcore.plugins.PluginSession.load` (without loading any); None for metadata without the core's entry point."""
    found = importlib.metadata.entry_points(group=plugins.ENTRY_POINT_GROUP)
    core = [ep for ep in found if ep.dist is not None and ep.dist.name == plugins.CORE_DISTRIBUTION]
    if not core:
        return None
    seen, listed = set(), []
    for ep in core + ([ep for ep in found if ep not in core] if not cfg.disable_plugin_autoload else []):
        dist = ep.dist.name if ep.dist is not None else "(unknown distribution)"
        if (ep.name, dist) not in seen:
            seen.add((ep.name, dist))
            blocked = ep.name in cfg.disable_plugins and dist != plugins.CORE_DISTRIBUTION
            listed.append((ep.name, dist, ep.dist.version if ep.dist is not None else "?", blocked))
    return listed


_HELP = ("-h", "--help")


def _fast(argv: list[str]) -> int | None:
    """``ebm``, ``ebm --help``, ``ebm --version`` and ``ebm COMMAND ... --help`` without importing torch or a plugin;
    None where only the whole parser can answer: a configuration error (it reports it), a plugin that loads and
    declares no commands, a command whose arguments are not declared (:mod:`ebmcore.commands`), a command line that
    the declared parser parses without printing its help, or plugins already loaded in this process
    (``ebmcore.register_plugin`` may have added one that no entry point names)."""
    if plugins.loaded():  # loaded: it may hold register_plugin's
        return None
    command = next((a for a in argv if not a.startswith("-")), None)
    asks_help = command is not None and any(a in _HELP for a in argv[argv.index(command) + 1 :])
    if argv not in ([], ["-h"], ["--help"], ["--version"]) and not asks_help:
        return None
    try:
        cfg = config.get_config()
        found = _plugin_entry_points(cfg)
        torch_version = importlib.metadata.version("torch")
    except (ebmcore.EBMError, importlib.metadata.PackageNotFoundError):
        return None
    if found is None:
        return None
    if argv == ["--version"]:
        extra = ", ".join(f"{dist} {version}" for _, dist, version, _ in found if dist != plugins.CORE_DISTRIBUTION)
        print(f"ebm {ebmcore.__version__} (torch {torch_version}; plugins: {extra or 'none'})")
        return 0
    parser, sub = _core_parser()
    core = set(sub.choices)
    arguments: dict[str, tuple[str, str, Any]] = {}  # command -> (plugin, distribution, its declared arguments)
    loading = [(name, dist) for name, dist, _, blocked in found if not blocked]
    for name, dist in sorted(loading, key=lambda plugin: plugin[1] not in FIRST_PARTY_DISTRIBUTIONS):  # as add_commands
        declared, declared_arguments, why = commands.read_declarations(name, dist)
        if why:  # the whole parser answers; say which plugin's declaration failed, as a failed plugin is named
            print(
                f"warning: plugin {name!r} ({dist}): its command declaration {why}; `ebm --help` imports the "
                "plugins to list its commands instead. Make that module define the dict and import nothing.",
                file=sys.stderr,
            )
        if declared is None:
            return None
        for name_, line in declared.items():
            if name_ not in sub.choices:  # a taken name is not replaced (add_commands)
                sub.add_parser(name_, help=line)
                if name_ in declared_arguments:
                    arguments[name_] = (name, dist, declared_arguments[name_])
    if command is not None and command not in core:
        if command not in arguments:  # not declared here (or only its one-line help is): the whole parser's --help
            return None
        plugin, dist, add_arguments = arguments[command]
        try:
            add_arguments(sub.choices[command])
        except Exception as exc:  # noqa: BLE001 - the whole parser answers, and the plugin is named
            print(
                f"warning: plugin {plugin!r} ({dist}): its declared arguments of `ebm {command}` cannot be added "
                f"({type(exc).__name__}: {exc}); `ebm {command} --help` imports the plugins instead.",
                file=sys.stderr,
            )
            return None
    _add_missing_commands(sub)
    parser.parse_args(argv)  # --help: prints the help and exits 0, as the whole parser does
    if argv:  # parsed without printing a help (`ebm sample -- --help`, or an unavailable command): the whole parser
        return None
    parser.print_help()
    return 2


def _missing_command(command: str, dist: str, args: argparse.Namespace) -> int:
    """``ebm <command>`` of a first-party plugin that is not installed, blocked or broken: say which and the fix."""
    s = plugins.session()
    record = next((r for r in s.records.values() if r.distribution == dist), None)
    where = "" if s.config.source == "defaults" else f" ({s.config.source})"
    if record is not None and record.status == "blocked":
        why = (
            f"is installed but blocked: its plugin '{record.name}' is named by EBM_DISABLE_PLUGINS or the "
            f"configuration's disable_plugins{where}; remove it from there"
        )
    elif record is not None and record.status == "failed":
        why = f"failed to load ({record.error}); fix or reinstall it (`ebm plugins -v` shows the traceback)"
    elif record is None and s.config.disable_plugin_autoload:
        why = (
            f"is not loaded: plugin autoload is off (EBM_DISABLE_PLUGIN_AUTOLOAD or the configuration's "
            f"disable_plugin_autoload{where}); turn it on"
        )
    else:
        why = f"is not installed: {install_hint(dist)}"
    raise UnknownComponentError(f"`ebm {command}` is provided by the plugin {dist}, which {why}.")


def _show_warning(message: Any, category: type, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
    print(f"warning: {message}", file=file or sys.stderr)


_INTERRUPTED = "interrupted: files already written are complete; a checkpointed or streamed run continues with --resume."


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(argv)
    except KeyboardInterrupt:  # Ctrl-C, while torch and the plugins import too: one line and status 130
        print(_INTERRUPTED, file=sys.stderr)
        return 130


def _exit_at_interrupt(signum: int, frame: Any) -> None:
    sys.stdout.flush()
    print(_INTERRUPTED, file=sys.stderr, flush=True)
    os._exit(130)


@contextlib.contextmanager
def _interrupt_ends_process(command_line: bool) -> Iterator[None]:
    """On the command line (``main()`` without ``argv``), Ctrl-C while the parser is built (torch and the plugins
    import: seconds) ends the process at once, with the one line and status 130: nothing is written yet, and a
    ``KeyboardInterrupt`` raised inside an import may be caught by the library that imports (leaving a half-imported
    module: a plugin then "fails to load", or the run goes on). Nothing changes in-process, nor where SIGINT is not
    Python's default handler (ignored in a background job, or a caller's)."""
    installed = False
    if command_line and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        with contextlib.suppress(ValueError):  # ValueError: not the main thread
            signal.signal(signal.SIGINT, _exit_at_interrupt)
            installed = True
    try:
        yield
    finally:
        if installed:
            signal.signal(signal.SIGINT, signal.default_int_handler)


def _main(argv: Sequence[str] | None) -> int:
    with _interrupt_ends_process(argv is None):
        fast = _fast(sys.argv[1:] if argv is None else list(argv))
        if fast is not None:
            return fast
        try:
            parser = _parser()
        except EBMError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        args = parser.parse_args(argv)
    logs.configure(logging.WARNING if getattr(args, "quiet", False) else args.log_level)
    if args.command is None and not args.version:
        parser.print_help()
        return 2
    try:
        with warnings.catch_warnings():  # a warning is one line, as the errors are
            warnings.showwarning = _show_warning
            return _cmd_version(args) if args.version else args.func(args)
    except EBMError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
