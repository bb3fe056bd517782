#!/usr/bin/env bash
# Set up a fresh machine (scripts/bootstrap.sh), run ruff and mypy, then the whole test suite (arguments go to
# pytest); the suite brings the local SLURM cluster up once and down at the end.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh || exit 1
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
# Lint, format and type checks first (seconds): a finding stops here, before the cluster comes up.
python3 -m ruff check . || { echo "ruff check failed (ruff check --fix . fixes many findings)"; exit 1; }
python3 -m ruff format --check . || { echo "ruff format --check failed: run ruff format on the files named above"; exit 1; }
python3 -m mypy || { echo "mypy failed: fix the type errors above (mypy checks what pyproject.toml's [tool.mypy] names)"; exit 1; }
python3 -m pytest -q -ra "$@"
rc=$?
[ $rc -eq 5 ] && { echo "no tests were collected"; exit 1; }
exit $rc
