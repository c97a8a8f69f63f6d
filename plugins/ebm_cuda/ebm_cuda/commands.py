"""The ``ebm`` subcommands this plugin adds, with their one-line help and their arguments: ``ebm --help`` and
``ebm cuda --help`` read this module without importing ebm_cuda (entry point ``cuda`` of the group
``ebmcore.commands``), so this module imports nothing; the parser of :mod:`ebm_cuda.cli` takes its help and
arguments from it."""

COMMANDS = {
    "cuda": "ebm-cuda kernels: availability and ahead-of-time builds",
}


def cuda_arguments(parser) -> None:
    """The sub-commands of ``ebm cuda`` (``info``, ``build``) and their arguments; which one runs is
    ``args.cuda_command``."""
    sub = parser.add_subparsers(dest="cuda_command", required=True)
    sub.add_parser("info", help="say which kernel builds can run here, and why not")
    b = sub.add_parser("build", help="compile the kernels now (they are otherwise compiled on first use, then cached)")
    b.add_argument("--arch", nargs="*", metavar="CC", help="CUDA architectures, e.g. 80 90 (default: this GPU's)")
    b.add_argument("--host-only", action="store_true", help="build only the CPU kernels")


ARGUMENTS = {"cuda": cuda_arguments}
"""Each command's arguments, added to its parser by ``ebm COMMAND --help`` (without importing this plugin) and by
this plugin's ``ebm_add_commands`` (:mod:`ebmcore.commands`)."""
