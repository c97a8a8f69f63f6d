"""The ``ebm`` subcommands this plugin adds, with their one-line help and their arguments: ``ebm --help`` and
``ebm train --help`` read this module without importing ebm_losses (entry point ``losses`` of the group
``ebmcore.commands``), so this module imports nothing but the standard library; the parser of
:mod:`ebm_losses.train_job` takes its help and arguments from it."""

COMMANDS = {
    "train": "train an energy model (bundled default: sliced score matching on eight Gaussians)",
}


def bundled_config_names() -> list[str]:
    """The names ``ebm train NAME`` takes: the bundled ``configs/train_<name>.toml`` files beside this module, sorted."""
    from pathlib import Path

    folder = Path(__file__).parent / "configs"
    return sorted(p.name.removeprefix("train_").removesuffix(".toml") for p in folder.glob("train_*.toml"))


def train_arguments(p) -> None:
    """The arguments of ``ebm train``."""
    p.add_argument(
        "config",
        nargs="?",
        help="a TOML configuration, or the name of a bundled one: "
        f"{', '.join(bundled_config_names())} (default: the bundled "
        "train_default.toml)",
    )
    p.add_argument("--out", help="run directory (default: [output] dir)")
    p.add_argument("--device", help="torch device, e.g. cpu or cuda:0 (default: [train] device)")
    p.add_argument("--backend", help='kernel backend selection, e.g. "torch"')
    p.add_argument("--seed", type=int, help="seed of the trainer's generator (default: [train] seed)")
    p.add_argument("--steps", type=int, help="total optimisation steps (default: [train] steps)")
    p.add_argument(
        "--threads",
        type=int,
        help="torch threads, default 1; 0: the cores no other process keeps busy (default: [train] threads)",
    )
    p.add_argument("--resume", action="store_true", help="continue from the run directory's checkpoint, exactly")
    p.add_argument("--overwrite", action="store_true", help="start afresh in a run directory that holds a training")
    p.add_argument("--quiet", action="store_true", help="no progress bar, no lines about what was skipped")


ARGUMENTS = {"train": train_arguments}
"""Each command's arguments, added to its parser by ``ebm COMMAND --help`` (without importing this plugin) and by
this plugin's ``ebm_add_commands`` (:mod:`ebmcore.commands`)."""
