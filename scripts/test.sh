#!/usr/bin/env bash
# Set up a fresh machine (scripts/bootstrap.sh), run ruff and mypy, then the test suite on SLURM 22.05 (this machine's
# packages), the cluster tests again on SLURM 24.11 (a Debian 13 root file system: docs/slurm-versions.md) and the
# Snakemake 8.30 tier (scripts/snakemake8.sh). Each brings its own local cluster up once and down at the end (the
# default's tier runs on two workers, a cluster each).
#   scripts/test.sh [--slurm RELEASE|both] [PYTEST ARGS]
# The releases are snakemake_executor_multinode/contract/releases.py's (22.05, the default, and 24.11 today).
# Arguments go to pytest. With --slurm both (the default) the other releases' tiers (beside the default's) and then the
# Snakemake 8.30 tier run when no test is named (the arguments are options only, like --cpu-load);
# --slurm 24.11 runs the named tests (by default tests/cluster) on 24.11 alone.
set -uo pipefail
cd "$(dirname "$0")/.."
# One name a line, the default first: the default runs the whole suite, each other release the cluster tests.
mapfile -t releases < <(python3 -m snakemake_executor_multinode.contract.releases)
[ ${#releases[@]} -gt 0 ] || { echo "python3 -m snakemake_executor_multinode.contract.releases named no release"; exit 2; }
default=${releases[0]}
choices="$(printf '%s, ' "${releases[@]}")"
choices="${choices%, } or both"
slurm=both
if [ "${1:-}" = --slurm ]; then
    slurm=${2:-}
    shift 2 || { echo "--slurm needs $choices"; exit 2; }
fi
known=0
for choice in "${releases[@]}" both; do [ "$slurm" = "$choice" ] && known=1; done
[ $known = 1 ] || { echo "--slurm must be $choices, got '$slurm'"; exit 2; }
bash scripts/bootstrap.sh || exit 1
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
# Lint, format and type checks first (seconds): a finding stops here, before the cluster comes up.
python3 -m ruff check . || { echo "ruff check failed (ruff check --fix . fixes many findings)"; exit 1; }
python3 -m ruff format --check . || { echo "ruff format --check failed: run ruff format on the files named above"; exit 1; }
python3 -m mypy || { echo "mypy failed: fix the type errors above (mypy checks what pyproject.toml's [tool.mypy] names)"; exit 1; }

named=0  # a test named (a path, a node id): another release's tier is then asked for with --slurm RELEASE
for arg in "$@"; do case "$arg" in -*) ;; *) named=1 ;; esac; done
rc=0
run() {  # one pytest run; "no tests" is a failure
    python3 -m pytest -q -ra "$@"
    local code=$?
    [ $code -eq 5 ] && { echo "no tests were collected"; code=1; }
    [ $code -ne 0 ] && rc=$code
}
# With --slurm both (and no test named) the other releases' cluster tiers run beside the default's, each on its own
# cluster folder (most of a cluster test's time is waiting for SLURM, so they share this machine's cores); their output
# is kept and printed after the default's. The Snakemake 8.30 tier follows (a third cluster beside two was not tried).
declare -A beside=()  # tier -> "pid output-file"
tiers=()              # the tiers beside, in the order they started
if [ "$slurm" = both ] && [ $named = 0 ]; then
    for release in "${releases[@]:1}"; do
        # a cluster folder of its own also where MULTINODE_TEST_CLUSTER_DIR names one for the default's tier
        dir=${MULTINODE_TEST_CLUSTER_DIR:+$MULTINODE_TEST_CLUSTER_DIR-$release}
        tier="the cluster tests on SLURM $release"
        out=$(mktemp "${TMPDIR:-/tmp}/multinode-tier-$release.XXXXXX")
        echo "[test] $tier, beside the $default tier (output: $out, printed at the end)"
        (env MULTINODE_TEST_SLURM="$release" ${dir:+MULTINODE_TEST_CLUSTER_DIR="$dir"} \
            python3 -m pytest -q -ra "$@" tests/cluster >"$out" 2>&1) &
        beside[$tier]="$! $out"
        tiers+=("$tier")
    done
fi
if [ "$slurm" = both ] || [ "$slurm" = "$default" ]; then
    if [ $named = 0 ]; then
        # The whole suite on two pytest-xdist workers, a test file to each in turn, each worker with a cluster of its
        # own (tests/helpers.py): a cluster test mostly waits for SLURM, so two share the cores, and this tier is
        # what sets CI's length.
        run -n 2 --dist loadfile "$@"
    else
        run "$@"
    fi
fi
for tier in "${tiers[@]}"; do
    read -r pid out <<<"${beside[$tier]}"
    wait "$pid"
    code=$?
    echo "[test] $tier:"
    cat "$out"
    [ $code -eq 5 ] && { echo "no tests were collected"; code=1; }
    [ $code -ne 0 ] && rc=$code
done
for release in "${releases[@]:1}"; do
    if [ "$slurm" = "$release" ]; then
        echo "[test] the cluster tests on SLURM $release"
        if [ $named = 1 ]; then
            MULTINODE_TEST_SLURM=$release run "$@"
        else
            MULTINODE_TEST_SLURM=$release run "$@" tests/cluster
        fi
    fi
done
if [ "$slurm" = both ] && [ $named = 0 ]; then
    # the oldest Snakemake pyproject.toml allows, in a venv of its own, on SLURM 22.05 (its own cluster folder too)
    echo "[test] the Snakemake 8.30 tier"
    bash scripts/snakemake8.sh "$@"
    code=$?
    [ $code -ne 0 ] && rc=$code
fi
exit $rc
