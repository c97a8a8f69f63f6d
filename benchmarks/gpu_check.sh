#!/usr/bin/env bash
# `make gpu-check` (DRY=1: `--dry`): benchmarks/gpu_check.py with a Python that imports this tree's ebm packages.
# On a bare GPU machine (torch, nvcc, no network, nothing of ebm installed) it installs them first, offline:
# editable, into a virtual environment over the chosen Python's packages (.gpu-check/venv, checked to import torch
# and numpy); where it cannot (no setuptools >= 77, say), it puts the sources on PYTHONPATH with minimal dist-info
# folders for their entry points (.gpu-check/site). Arguments go to gpu_check.py; PYTHON picks the interpreter.
# `--install-only`: only that, then print the Python chosen (a path from the repository root), and PYTHONPATH=...
# where it is needed (tests/test_gpu_check_install.py).
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
INSTALL_ONLY= SITE=
if [ "${1:-}" = "--install-only" ]; then INSTALL_ONLY=1; shift; fi
command -v nvcc >/dev/null 2>&1 || export PATH="$PATH:/usr/local/cuda/bin"
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
ours() {  # does "$1" import ebmcore and the plugins from this tree?
  "$1" - "$ROOT" <<'PY' >/dev/null 2>&1
import os, sys
import ebmcore, ebm_cuda, ebm_samplers, ebm_losses
root = os.path.realpath(sys.argv[1])
assert all(os.path.realpath(m.__file__).startswith(root + os.sep) for m in (ebmcore, ebm_cuda, ebm_samplers, ebm_losses))
PY
}
VENV=.gpu-check/venv
no() { echo "gpu-check: $*" >&2; }
venv_over() {  # $VENV over "$1"'s packages, with this tree's installed into it; or a line saying why not
  local py=$1 vpy=$VENV/bin/python site
  "$py" -c 'import torch, numpy' >/dev/null 2>&1 || { no "$py does not import torch and numpy"; return 1; }
  rm -rf "$VENV"
  # --without-pip: pip and setuptools are then "$1"'s; ensurepip's would hide them (Python 3.11's setuptools 65
  # cannot build these packages)
  "$py" -m venv --system-site-packages --without-pip "$VENV" >&2 || { no "$py -m venv failed"; return 1; }
  if "$py" -c 'import sys; sys.exit(sys.prefix == sys.base_prefix)'; then
    # "$1" is itself a virtual environment (a GPU image's /opt/torch/.venv): --system-site-packages gave the packages
    # of the Python it was made from, not its own. A .pth file lists its site-packages after the new environment's.
    site=$("$vpy" -c 'import sysconfig; print(sysconfig.get_path("purelib"))') &&
      "$py" -c 'import site; print("\n".join(site.getsitepackages()))' >"$site/gpu_check_parent.pth" || return 1
  fi
  "$vpy" -c 'import torch, numpy' >/dev/null 2>&1 || { no "$VENV does not import torch and numpy, which $py does"; return 1; }
  "$vpy" -m pip --version >/dev/null 2>&1 || "$vpy" -m ensurepip >&2 || { no "no pip for $VENV"; return 1; }
  "$vpy" -m pip install --quiet --no-index --no-build-isolation --no-deps -e . $PLUGINS >&2 ||
    { no "pip could not install them into $VENV"; return 1; }
  ours "$vpy" || { no "$vpy does not import them from this tree"; return 1; }
}
if ! ours "$PY"; then
  echo "gpu-check: installing this tree's ebm packages for $PY (offline) ..." >&2
  PLUGINS=$(for p in plugins/*/pyproject.toml; do printf -- '-e %s ' "$(dirname "$p")"; done)
  if venv_over "$PY"; then
    PY=$VENV/bin/python
  else
    rm -rf "$VENV"  # no later command picks up a broken environment
    echo "gpu-check: no virtual environment ($VENV removed); using the sources on PYTHONPATH instead" >&2
    SITE=.gpu-check/site
    "$PY" benchmarks/gpu_check.py --bare-site "$SITE" >&2 || exit 2
    export PYTHONPATH="$ROOT:$(for p in plugins/*/pyproject.toml; do printf '%s:' "$ROOT/$(dirname "$p")"; done)$ROOT/$SITE${PYTHONPATH:+:$PYTHONPATH}"
    ours "$PY" || { echo "gpu-check: $PY cannot import the ebm packages (is torch installed?)" >&2; exit 2; }
  fi
fi
if [ -n "$INSTALL_ONLY" ]; then
  echo "$PY"
  [ -z "$SITE" ] || echo "PYTHONPATH=$PYTHONPATH"
  exit 0
fi
exec "$PY" benchmarks/gpu_check.py "$@"
