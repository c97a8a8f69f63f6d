#!/usr/bin/env bash
# `make gpu-check` (DRY=1: `--dry`): benchmarks/gpu_check.py with a Python that imports this tree's ebm packages.
# On a bare GPU machine (torch, nvcc, no network, nothing of ebm installed) it installs them first, offline:
# editable, into a virtual environment over the system's packages (.gpu-check/venv); where pip cannot
# (no setuptools >= 77, say), it puts the sources on PYTHONPATH with minimal dist-info folders for their entry
# points (.gpu-check/site). Arguments go to gpu_check.py; PYTHON picks the interpreter.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
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
if ! ours "$PY"; then
  echo "gpu-check: installing this tree's ebm packages for $PY (offline) ..." >&2
  VENV=.gpu-check/venv
  PLUGINS=$(for p in plugins/*/pyproject.toml; do printf -- '-e %s ' "$(dirname "$p")"; done)
  if "$PY" -m venv --system-site-packages "$VENV" >&2 && \
     "$VENV/bin/python" -m pip install --quiet --no-index --no-build-isolation --no-deps -e . $PLUGINS >&2 && ours "$VENV/bin/python"; then
    PY=$VENV/bin/python
  else
    echo "gpu-check: pip could not install them; using the sources on PYTHONPATH instead" >&2
    SITE=.gpu-check/site
    "$PY" benchmarks/gpu_check.py --bare-site "$SITE" >&2 || exit 2
    export PYTHONPATH="$ROOT:$(for p in plugins/*/pyproject.toml; do printf '%s:' "$ROOT/$(dirname "$p")"; done)$ROOT/$SITE${PYTHONPATH:+:$PYTHONPATH}"
    ours "$PY" || { echo "gpu-check: $PY cannot import the ebm packages (is torch installed?)" >&2; exit 2; }
  fi
fi
exec "$PY" benchmarks/gpu_check.py "$@"
