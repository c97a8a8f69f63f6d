"""The ``ebm`` subcommands this plugin adds, with their one-line help: ``ebm --help`` reads this dict without importing
ebm_samplers (entry point ``samplers`` of the group ``ebmcore.commands``), so this module imports nothing; the
parsers of :mod:`ebm_samplers.sample_job` and :mod:`ebm_samplers.profiling` take their help from it."""

COMMANDS = {
    "sample": "sample an energy with any registered sampler (bundled default config)",
    "profile": "time per step and its breakdown for a sampler configuration",
}
