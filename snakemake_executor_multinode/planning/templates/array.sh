#!/bin/bash
# {{title}}
# Written by snakemake-executor-plugin-multinode: jobs of one rule that ask SLURM for the same go as one job array
# (one submission). Each element runs its own job script, as a job of its own would, under the key
# <array job id>_<task id>, which names its log and markers.
{{sbatch}}

case "$SLURM_ARRAY_TASK_ID" in
{{elements}}
esac
echo "[multinode] array task ${SLURM_ARRAY_TASK_ID:-?} has no job script" >&2
exit 1
