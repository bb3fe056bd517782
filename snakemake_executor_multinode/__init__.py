"""Multi-node SLURM jobs for Snakemake rules: the core (no Snakemake import here).

Data flows one way: rule resources -> request.JobRequest (validated) -> jobscript.render -> slurm.submit ->
status.Tracker. `multinode torchrun` (launch.py) runs inside the job; `multinode cluster` (sandbox/) is the local
cluster to try it on.
"""

__version__ = "0.1.0"
