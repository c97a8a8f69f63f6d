"""The ``ebm`` subcommands this plugin adds, with their one-line help: ``ebm --help`` reads this dict without importing
ebm_cuda (entry point ``cuda`` of the group ``ebmcore.commands``), so this module imports nothing; the parser of
:mod:`ebm_cuda.cli` takes its help from it."""

COMMANDS = {
    "cuda": "ebm-cuda kernels: availability and ahead-of-time builds",
}
