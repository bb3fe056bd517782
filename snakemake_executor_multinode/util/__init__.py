"""Small utilities any stage may use, knowing nothing of the plugin: units (time and memory as rules and SLURM write
them), private_files (whole-or-nothing private writes). The lowest stage: it imports nothing of the others."""
