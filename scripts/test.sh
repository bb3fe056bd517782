#!/usr/bin/env bash
# Set up a fresh machine (scripts/bootstrap.sh), then run the whole test suite; the suite brings the local
# SLURM cluster up once and down at the end.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh || exit 1
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
python3 -m pytest -q -ra "$@"
rc=$?
[ $rc -eq 5 ] && { echo "no tests were collected"; exit 1; }
exit $rc
