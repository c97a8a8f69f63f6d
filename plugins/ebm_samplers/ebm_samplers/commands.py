"""The ``ebm`` subcommands this plugin adds, with their one-line help and their arguments: ``ebm --help`` and
``ebm sample --help`` read this module without importing ebm_samplers (entry point ``samplers`` of the group
``ebmcore.commands``), so this module imports nothing; the parsers of :mod:`ebm_samplers.sample_job` and
:mod:`ebm_samplers.profiling` take their help and arguments from it."""

COMMANDS = {
    "sample": "sample an energy with any registered sampler (bundled default config)",
    "profile": "time per step and its breakdown for a sampler configuration",
}

DRAWS_FORMATS = ("npz", "netcdf", "none")
"""The values of ``--format`` (the keys of :data:`ebm_samplers.draws.FORMATS`, which a test holds equal)."""


def sample_arguments(p) -> None:
    """The arguments of ``ebm sample``."""
    p.add_argument("config", nargs="?", help="a TOML configuration (default: the bundled sample_default.toml)")
    p.add_argument("--out", help="run directory (default: [output] dir)")
    p.add_argument("--device", help="torch device, e.g. cpu or cuda:0 (default: [run] device)")
    p.add_argument("--backend", help='kernel backend selection, e.g. "torch" or "cuda,torch"')
    p.add_argument("--seed", type=int, help="seed of the run's generator (default: [run] seed)")
    p.add_argument("--sampler", help="a registered sampler name (default: [sampler] name)")
    p.add_argument("--step-size", type=float, help="sample with this step size as given: no warm-up unless --warmup is given too")
    p.add_argument("--warmup", type=int, help="warm-up (adaptation) steps; 0 for none (default: [sampler] warmup)")
    p.add_argument("--n-chains", type=int, help="number of chains (default: [sampler] n_chains)")
    p.add_argument("--n-steps", type=int, help="kept steps after burn-in (default: [sampler] n_steps)")
    p.add_argument("--n-samples", type=int, help="stream this many samples to disk in chunks")
    p.add_argument("--chunk-size", type=int, help="chains per streamed chunk (default: [run] chunk_size)")
    p.add_argument(
        "--threads", type=int, help="torch threads, default 1; 0: the cores no other process keeps busy (default: [run] threads)"
    )
    p.add_argument("--resume", action="store_true", help="continue a streamed or checkpointed run where it stopped")
    p.add_argument("--overwrite", action="store_true", help="start afresh in a run directory that holds a run")
    p.add_argument(
        "--strict",
        action="store_true",
        help="exit with status 1 if any chain went non-finite or the run has a warning (R-hat, ESS, divergences, E-BFMI)",
    )
    p.add_argument(
        "--format",
        choices=list(DRAWS_FORMATS),
        dest="draws_format",
        help="the draws file: npz (numpy), netcdf (ArviZ; needs ebm-samplers[arviz]) or none (default: [output] draws)",
    )
    p.add_argument("--quiet", action="store_true", help="print only the final summary")


def profile_arguments(p) -> None:
    """The arguments of ``ebm profile``."""
    p.add_argument("config", nargs="?", help="a sample configuration (default: the bundled one)")
    p.add_argument("--sampler", help="a registered sampler name (default: [sampler] name)")
    p.add_argument("--n-chains", type=int, help="number of chains (default: [sampler] n_chains)")
    p.add_argument("--n-steps", type=int, default=50, help="steps per timed run (default: 50)")
    p.add_argument("--device", help="torch device, e.g. cpu or cuda:0 (default: [run] device)")
    p.add_argument(
        "--threads", type=int, help="torch threads, default 1; 0: the cores no other process keeps busy (default: [run] threads)"
    )


ARGUMENTS = {"sample": sample_arguments, "profile": profile_arguments}
"""Each command's arguments, added to its parser by ``ebm COMMAND --help`` (without importing this plugin) and by
this plugin's ``ebm_add_commands`` (:mod:`ebmcore.commands`)."""
