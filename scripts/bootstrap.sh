#!/usr/bin/env bash
# Install everything the project needs on a fresh Debian 12 machine (as root); fast when already done.
#   apt: slurm-wlm 22.05 (slurmctld, slurmd, client), munge, MariaDB + slurmdbd, iproute2, iptables, podman + runc,
#        strace, mmdebstrap, chromium
#   pip: torch 2.13.0 (the CPU wheel) FIRST and pinned, then the package with its train/test/trackers extras,
#        then colossalai 0.5.0 with --no-deps (its metadata pins torch<=2.5.1 and would pull a CUDA torch).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

# strace: benchmarks/state_scaling.py counts a status cycle's system calls
# mmdebstrap: `multinode cluster up --slurm 24.11` builds its Debian 13 root file system with it (once, cached)
# iptables: the network-split test drops a node's traffic in its namespace (tests/cluster/test_network_split_cluster.py)
# podman + runc: the container tests' runtime (runc: crun refuses a hybrid cgroup v1/v2 host; tests/containers/)
# chromium: a headless browser reads the example's `snakemake --report` as rendered (tests/cluster/report_walk.js)
apt_pkgs=(slurmctld slurmd slurm-client munge mariadb-server slurmdbd iproute2 iptables util-linux procps podman runc strace
          mmdebstrap chromium)
missing=()
for p in "${apt_pkgs[@]}"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  echo "[bootstrap] apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null
  apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
fi

pip=("$PY" -m pip install -q --disable-pip-version-check -c constraints.txt)
if ! "$PY" -c 'import torch, sys; sys.exit(torch.__version__.split("+")[0] != "2.13.0")' 2>/dev/null; then
  echo "[bootstrap] pip install torch==2.13.0"
  "${pip[@]}" torch==2.13.0
fi
if ! "$PY" -c 'import snakemake, colossalai, transformers, galore_torch, matplotlib, pytest, xdist, ruff, mypy, build, hatchling' 2>/dev/null ||
    ! "$PY" -c 'import tensorboard, wandb, mlflow' 2>/dev/null || ! command -v py-spy >/dev/null; then
  echo "[bootstrap] pip install -e .[train,test,trackers] and colossalai==0.5.0 --no-deps"
  "${pip[@]}" -e ".[train,test,trackers]"
  "${pip[@]}" --no-deps colossalai==0.5.0
fi
# Always point the installed package (and the `multinode` command) at this checkout.
"${pip[@]}" --no-deps -e .
echo "[bootstrap] ready"
