"""Multi-node SLURM jobs for Snakemake rules: the core (no Snakemake import here). Its stages, lowest first:
contract, slurm, sandbox, launching, planning, watching, session.py, cli; docs/design.md draws them once.
"""

__version__ = "0.1.0"
