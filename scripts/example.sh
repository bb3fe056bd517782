#!/usr/bin/env bash
# The main job: set up a fresh machine, start the local 3-node SLURM cluster, and run the example pipeline
# (preprocess -> train with ColossalAI on 2 nodes x 2 ranks -> evaluate) through `snakemake --executor multinode`.
# Run it again: nothing to do. Change workflows/config.yaml's train section: train and evaluate rerun.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
multinode cluster up
eval "$(multinode cluster env)"
export HF_HUB_OFFLINE=1
snakemake -s workflows/Snakefile --workflow-profile workflows/profiles/local "$@"
results=$(python3 -c 'import yaml; print(yaml.safe_load(open("workflows/config.yaml"))["results"])')
echo
echo "model:        $PWD/$results/model/final.pt"
echo "evaluation:   $PWD/$results/eval/metrics.json"
echo "loss curve:   $PWD/$results/eval/loss.png"
echo "job logs:     $PWD/.snakemake/multinode/logs/"
echo "allocation:   $PWD/$results/report/ (goodput chart, efficiency, provenance)"
echo "report:       snakemake -s workflows/Snakefile --report report.html  (loss curve, allocation, provenance)"
echo "stop the cluster with: multinode cluster down"
