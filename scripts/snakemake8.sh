#!/usr/bin/env bash
# The Snakemake 8.30 tier: the tests marked `snakemake8` (Snakemake's own executor test workflows, the 2-node
# workflow, the rerun table, the reattach case) again on the oldest Snakemake that pyproject.toml allows, on a SLURM
# 22.05 cluster of their own. Snakemake 8.30 lives in a venv of its own, .venv/snakemake8 in this checkout, made once:
# --system-site-packages, so torch, pytest and the rest are this machine's (scripts/bootstrap.sh installs them);
# only Snakemake 8.30 and the dependencies it wants other versions of go into the venv, where they come first.
#   scripts/snakemake8.sh [PYTEST ARGS]    (scripts/test.sh runs it beside the 22.05 tier, after the bootstrap)
set -uo pipefail
cd "$(dirname "$0")/.."
version=8.30
venv=.venv/snakemake8
py=$venv/bin/python
pip=("$py" -m pip install -q --disable-pip-version-check -c constraints.txt)
if [ ! -x "$py" ]; then
    echo "[snakemake8] python3 -m venv --system-site-packages $venv"
    python3 -m venv --system-site-packages "$venv" || exit 1
fi
# The venv's own site-packages come first on its path: the version found is the venv's Snakemake once installed.
if ! "$py" -c "import importlib.metadata as m, sys; sys.exit(m.version('snakemake').rsplit('.', 1)[0] != '$version')"
then
    echo "[snakemake8] pip install snakemake==$version.* into $venv"
    "${pip[@]}" "snakemake==$version.*" || exit 1
fi
# This checkout, and its `multinode` command (a job's `multinode torchrun` runs the venv's Python), first on the path.
"${pip[@]}" --no-deps -e . || exit 1
export PATH="$PWD/$venv/bin:$PATH" HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
# A cluster folder of its own also where MULTINODE_TEST_CLUSTER_DIR names one for the other tiers (tests/helpers.py
# gives a Snakemake 8 session its own default folder).
[ -z "${MULTINODE_TEST_CLUSTER_DIR:-}" ] || export MULTINODE_TEST_CLUSTER_DIR="$MULTINODE_TEST_CLUSTER_DIR-snakemake8"
echo "[snakemake8] $("$py" -m snakemake --version | tail -n 1): pytest -m snakemake8 tests/cluster"
"$py" -m pytest -q -ra -m snakemake8 "$@" tests/cluster
code=$?
[ $code -eq 5 ] && { echo "no tests were collected"; code=1; }
exit $code
