"""The ``ebm`` subcommands this plugin adds, with their one-line help: ``ebm --help`` reads this dict without importing
ebm_losses (entry point ``losses`` of the group ``ebmcore.commands``), so this module imports nothing; the parser of
:mod:`ebm_losses.train_job` takes its help from it."""

COMMANDS = {
    "train": "train an energy model (bundled default: sliced score matching on eight Gaussians)",
}
