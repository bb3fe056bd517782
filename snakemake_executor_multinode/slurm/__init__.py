"""SLURM itself: the one client (sbatch, squeue, sacct, scancel, scontrol) with its states, retries and parsing, and
what this plugin knows of sbatch's flags."""
