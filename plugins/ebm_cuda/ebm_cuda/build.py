"""Compiling the kernels, cached: the host library with the C++ compiler, the CUDA library with nvcc, and for the
sanitizer checks the host library and ``kernels.cu`` itself (CUDA emulated on the host threads) with the C++ compiler.

All are plain shared libraries with a C interface (no torch headers, so they compile whatever torch
wheel is installed), loaded with ctypes by :mod:`ebm_cuda.library`. A build is cached under
``$EBM_CUDA_CACHE`` (default ``~/.cache/ebm_cuda``), keyed by the sources, the flags, the compiler
and, for the host build, the CPU (it is compiled with ``-march=native``); concurrent builds
(several ranks under torchrun) take a file lock and one compiles.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

__all__ = [
    "BuildError",
    "CSRC",
    "cache_dir",
    "find_cxx",
    "find_nvcc",
    "host_command",
    "nvcc_command",
    "build_host",
    "build_cuda",
    "SANITIZER_FLAGS",
    "THREAD_SANITIZER_FLAGS",
    "SANITIZER_RUNTIMES",
    "SANITIZER_OPTIONS",
    "sanitizer_runtimes",
    "sanitizer_environment",
    "sanitized_host_command",
    "build_host_sanitized",
    "emulated_cuda_command",
    "build_cuda_emulated",
]

CSRC = Path(__file__).resolve().parent / "csrc"
HOST_FLAGS = ("-O3", "-march=native", "-fno-math-errno", "-fopenmp", "-fPIC", "-shared", "-std=c++17")
NVCC_FLAGS = ("-O3", "-std=c++17", "--threads", "0", "-Xcompiler", "-fPIC", "-shared")  # --threads 0: one per arch, in parallel


class BuildError(RuntimeError):
    """A compiler is missing or failed; the message says which command and why."""


def cache_dir() -> Path:
    return Path(os.environ.get("EBM_CUDA_CACHE") or Path.home() / ".cache" / "ebm_cuda")


def find_cxx() -> str | None:
    """``$CXX``, else ``c++``, ``g++`` or ``clang++`` on the PATH."""
    return os.environ.get("CXX") or next((c for c in ("c++", "g++", "clang++") if shutil.which(c)), None)


def find_nvcc() -> str | None:
    """``$NVCC``, else ``$CUDA_HOME/bin/nvcc``, else ``nvcc`` on the PATH."""
    if os.environ.get("NVCC"):
        return os.environ["NVCC"]
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home and (Path(home) / "bin" / "nvcc").exists():
        return str(Path(home) / "bin" / "nvcc")
    return shutil.which("nvcc")


def _sources(unit: str) -> list[Path]:
    """What ``unit`` compiles: itself and the headers (``cuda_emulation.h`` only for ``kernels.cu``)."""
    headers = sorted((CSRC / "ebm").glob("*.h"))
    return [CSRC / unit, *(h for h in headers if unit == "kernels.cu" or h.name != "cuda_emulation.h")]


def _cpu_identity() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return os.uname().machine
    return next((line for line in lines if line.startswith("flags")), os.uname().machine)


def _digest(unit: str, command: list[str], extra: str = "") -> str:
    """The cache key: the sources' names and bytes, the command with the compiler named by its file name and the
    sources' folder by a placeholder (where the tree or the toolkit is installed changes no byte of the library, so a
    cache made in one checkout, or on another machine with the same compiler version, is used as is), and ``extra``
    (the compiler's ``--version``; for the host library the CPU's flags)."""
    h = hashlib.sha256()
    for path in _sources(unit):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    portable = [Path(command[0]).name, *(arg.replace(str(CSRC), "<csrc>") for arg in command[1:])]
    h.update("\0".join(portable).encode())
    h.update(extra.encode())
    return h.hexdigest()[:16]


def host_command(out: Path | str, cxx: str | None = None) -> list[str]:
    """The command that builds the host library ``out``."""
    cxx = cxx or find_cxx()
    if cxx is None:
        raise BuildError("no C++ compiler found for the host kernels (install g++ or clang++, or set CXX).")
    return [cxx, *HOST_FLAGS, f"-I{CSRC}", str(CSRC / "host.cpp"), "-o", str(out)]


def nvcc_command(archs: list[str], out: Path | str, *, compile_only: bool = False, nvcc: str | None = None) -> list[str]:
    """The command that builds the CUDA library ``out`` for ``archs`` (e.g. ``["80", "90"]``);
    ``compile_only`` produces an object file (what CI checks without a GPU)."""
    nvcc = nvcc or find_nvcc()
    if nvcc is None:
        raise BuildError("nvcc not found (install the CUDA toolkit, or set NVCC or CUDA_HOME).")
    gencode = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs]
    mode = ["-c"] if compile_only else []
    flags = [f for f in NVCC_FLAGS if not (compile_only and f == "-shared")]
    return [nvcc, *flags, *mode, *gencode, f"-I{CSRC}", str(CSRC / "kernels.cu"), "-o", str(out)]


def _version(tool: str) -> str:
    try:
        return subprocess.run([tool, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def _build(name: str, unit: str, make_command, extra: str) -> Path:
    probe = make_command(Path("OUT"))
    target = cache_dir() / f"{name}-{_digest(unit, probe, extra + _version(probe[0]))}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.exists():  # another process built it while we waited
            return target
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            out = Path(tmp) / target.name
            command = make_command(out)
            try:
                run = subprocess.run(command, capture_output=True, text=True, timeout=1800)
            except (OSError, subprocess.SubprocessError) as exc:
                raise BuildError(f"building {name} failed to run: {exc}\ncommand: {' '.join(command)}") from exc
            if run.returncode != 0:
                raise BuildError(
                    f"building {name} failed (exit {run.returncode}).\ncommand: {' '.join(command)}\n"
                    f"{(run.stderr or run.stdout)[-4000:]}"
                )
            os.replace(out, target)
    return target


def build_host() -> Path:
    """The host library, compiled now if not cached (about 10 s)."""
    return _build("libebm_host", "host.cpp", host_command, _cpu_identity())


SANITIZER_FLAGS = ("-O0", "-g1", "-fno-omit-frame-pointer", "-fsanitize=address,undefined", "-fno-sanitize-recover=undefined")
"""The sanitized host build's flags in place of ``-O3``: AddressSanitizer and UndefinedBehaviorSanitizer, every report
fatal; ``-O0`` compiles in about 10 s (the checks run at small sizes)."""


THREAD_SANITIZER_FLAGS = ("-O0", "-g1", "-fno-omit-frame-pointer", "-fsanitize=thread")
"""The flags of the ThreadSanitizer build of the CUDA emulation (:func:`build_cuda_emulated`), in place of ``-O3``
(``-O0``: about 6 s to compile, against 19 s with ``-O1``, and as fast at the tests' sizes)."""

SANITIZER_RUNTIMES = {"address": ("libasan.so", "libubsan.so"), "thread": ("libtsan.so",)}
"""The runtimes a process preloads to load a library built with :data:`SANITIZER_FLAGS` (``address``) or
:data:`THREAD_SANITIZER_FLAGS` (``thread``)."""

SANITIZER_OPTIONS = {
    "address": {"ASAN_OPTIONS": "detect_leaks=0:alloc_dealloc_mismatch=0", "UBSAN_OPTIONS": "print_stacktrace=1"},
    "thread": {"TSAN_OPTIONS": "halt_on_error=1"},
}
"""The environment of such a process besides ``LD_PRELOAD``: every report fatal, no leak report (Python's own allocations
are not leaks)."""


def sanitizer_runtimes(sanitizer: str, cxx: str | None = None) -> list[str] | None:
    """The paths of the C++ compiler's runtimes for ``sanitizer`` (``address`` or ``thread``), or None where it has
    none (GCC's, or Clang's where it names them the same)."""
    cxx = cxx or find_cxx()
    if cxx is None or shutil.which(cxx) is None:
        return None
    paths = []
    for name in SANITIZER_RUNTIMES[sanitizer]:
        try:
            found = subprocess.run([cxx, f"-print-file-name={name}"], capture_output=True, text=True, timeout=60).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return None
        if not found or not Path(found).is_file():
            return None
        paths.append(found)
    return paths


def sanitizer_environment(sanitizer: str) -> dict[str, str]:
    """The environment variables a process needs to load a library built for ``sanitizer``: ``LD_PRELOAD`` its
    runtimes, and :data:`SANITIZER_OPTIONS`. Raises :class:`BuildError` where the compiler has no such runtime."""
    runtimes = sanitizer_runtimes(sanitizer)
    if runtimes is None:
        raise BuildError(f"the C++ compiler has no {' or '.join(SANITIZER_RUNTIMES[sanitizer])}")
    return {"LD_PRELOAD": ":".join(runtimes), **SANITIZER_OPTIONS[sanitizer]}


def _optimised_with(command: list[str], flags: tuple[str, ...]) -> list[str]:
    """``command`` with ``flags`` in place of ``-O3``."""
    return [command[0], *flags, *(f for f in command[1:] if f != "-O3")]


def sanitized_host_command(out: Path | str, cxx: str | None = None) -> list[str]:
    """The command that builds the host library with :data:`SANITIZER_FLAGS` (GCC or Clang)."""
    return _optimised_with(host_command(out, cxx), SANITIZER_FLAGS)


def build_host_sanitized() -> Path:
    """The host library under AddressSanitizer and UndefinedBehaviorSanitizer, compiled now if not cached. Load it with
    ``EBM_CUDA_HOST_LIBRARY=<path>`` in a process started with ``sanitizer_environment("address")``: the sanitizer
    runtimes preloaded (``LD_PRELOAD="$(gcc -print-file-name=libasan.so):$(gcc -print-file-name=libubsan.so)"``), and
    ``ASAN_OPTIONS=detect_leaks=0``: Python's own allocations are not leaks."""
    return _build("libebm_host-sanitized", "host.cpp", sanitized_host_command, _cpu_identity())


def emulated_cuda_command(out: Path | str, sanitizer: str = "address", cxx: str | None = None) -> list[str]:
    """The command that builds ``kernels.cu`` as C++ for the host, CUDA emulated by ``csrc/ebm/cuda_emulation.h``
    (``-x c++ -DEBM_CUDA_EMULATION``; each block's threads are OS threads), under ``sanitizer``: ``address``
    (:data:`SANITIZER_FLAGS`) or ``thread`` (:data:`THREAD_SANITIZER_FLAGS`)."""
    flags = {"address": SANITIZER_FLAGS, "thread": THREAD_SANITIZER_FLAGS}[sanitizer]
    command = _optimised_with(host_command(out, cxx), flags)
    unit = {str(CSRC / "host.cpp"): str(CSRC / "kernels.cu"), "-fopenmp": "-pthread"}  # no OpenMP: std::thread
    return [command[0], "-x", "c++", "-DEBM_CUDA_EMULATION", *(unit.get(f, f) for f in command[1:])]


def build_cuda_emulated(sanitizer: str = "address") -> Path:
    """``kernels.cu`` built for the host under ``sanitizer`` (:func:`emulated_cuda_command`), compiled now if not
    cached (about 25 s for ``address``, 6 s for ``thread``). Load it as ``Library(path, "cuda")`` in a process with
    :func:`sanitizer_environment`, and run the ops on CPU tensors with it inside :func:`ebm_cuda.testing.cuda_emulation`
    (``benchmarks/gpu_check_kernels.py --emulated PATH``)."""
    return _build(
        f"libebm_cuda-emulated-{sanitizer}", "kernels.cu", lambda out: emulated_cuda_command(out, sanitizer), _cpu_identity()
    )


def build_cuda(archs: list[str]) -> Path:
    """The CUDA library for ``archs`` (e.g. ``["90"]`` for the current GPU), compiled now if not cached."""
    return _build("libebm_cuda-sm" + "_".join(archs), "kernels.cu", lambda out: nvcc_command(archs, out), "")
