"""Repository-wide pytest set-up, for the core's tests and every plugin's.

Some machines (sandboxes, some VMs) report AMX in cpuid but do not grant the process permission to
use it, and oneDNN's bfloat16 matmul then dies with SIGILL. Capping oneDNN at AVX512-BF16 for the
test run avoids that; it is read at the first oneDNN call, so setting it here is early enough.
Users on such machines set the same variable themselves (see docs/samplers.md).
"""

import os

os.environ.setdefault("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16")

import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

import ebmcore.config  # noqa: E402
from ebmcore import plugins  # noqa: E402
from ebmcore.testing.plugins import hide_environment_plugins  # noqa: E402

pytest_plugins = ["ebmcore.testing.fixtures"]

# Property tests (tests/test_input_properties.py): reproducible and bounded by default; `--hypothesis-profile=explore`
# searches at random, and further. The autouse fixture below resets state per test, not per example, which is fine.
settings.register_profile(
    "ci",
    max_examples=100,
    deadline=None,
    derandomize=True,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
settings.register_profile("explore", parent=settings.get_profile("ci"), max_examples=2000, derandomize=False)
settings.load_profile("ci")


CACHE_LOCATIONS = ("EBM_CUDA_CACHE",)
"""The EBM_* variables that only say where a cache lives, kept for every test."""


@pytest.fixture(autouse=True)
def clean_ebm_state(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory):
    """No EBM_* variables but :data:`CACHE_LOCATIONS`, no third-party plugin of the environment (only ebm's own and
    those a test installs: ``hide_environment_plugins``), an empty working directory, a fresh plugin session and config.

    ``EBM_CUDA_CACHE`` is kept: a build of the CUDA kernels carried to a GPU machine and named by it (docs/cuda.md) is
    then used by every test process, not rebuilt with nvcc (minutes, issue 38). A test that needs another cache sets
    its own. Every other EBM_* variable changes what ebm does (``EBM_BACKEND``, ``EBM_CONFIG``, ``EBM_DISABLE_PLUGINS``,
    ``EBM_CUDA_HOST_LIBRARY``: which library is loaded, ...) and is cleared (tests/test_test_isolation.py)."""
    for name in list(os.environ):
        if name.startswith("EBM_") and name not in CACHE_LOCATIONS:
            monkeypatch.delenv(name)
    hide_environment_plugins(monkeypatch)  # what a user installed beside ebm (docs/plugins.md's example) changes no test
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))
    ebmcore.config._config = None
    plugins.reset()
    yield
    ebmcore.config._config = None
    plugins.reset()
