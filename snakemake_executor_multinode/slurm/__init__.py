"""SLURM itself: the one client (sbatch, squeue, sacct, scancel, scontrol), SLURM's output formats, sbatch's flags
per release (docs/design.md: its modules)."""
