#!/usr/bin/env bash
# Create the benchmark environment benchmarks/.venv from scratch: the peers (torchebm, jax,
# blackjax) live here only, never in the project's own dependencies; ebm (the repo root and every
# plugin under plugins/*/ with a pyproject.toml) is installed editable on top.
#
#   bash benchmarks/setup.sh          # then: benchmarks/.venv/bin/python benchmarks/run.py
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/benchmarks/.venv}"  # override only to test this script elsewhere
PYTHON="${PYTHON:-python3}"

rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
PIP="$VENV/bin/pip"

"$PIP" install -q torch==2.13.0 torchebm==0.8.9 jax blackjax numpy "setuptools>=77" wheel

editables=(-e "$ROOT")
for plugin in "$ROOT"/plugins/*/; do
    if [[ -f "$plugin/pyproject.toml" ]]; then
        spec="${plugin%/}"
        [[ "$(basename "$spec")" == ebm_losses ]] && spec="$spec[images]"  # image_step.py: scikit-learn's digits
        editables+=(-e "$spec")
    fi
done
"$PIP" install -q --no-build-isolation "${editables[@]}"

"$VENV/bin/python" - "$VENV" <<'EOF'
import sys
import blackjax, ebm_losses, ebm_samplers, ebmcore, jax, torch, torchebm
print(f"{sys.argv[1]} ready: torch {torch.__version__}, torchebm {torchebm.__version__}, "
      f"jax {jax.__version__}, blackjax {blackjax.__version__}, ebmcore {ebmcore.__version__}, "
      f"ebm_losses {ebm_losses.__version__}")
EOF
