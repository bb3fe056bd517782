"""The `multinode` command: main (cluster, torchrun, preview, check) and runs (status, cancel, report)."""

from snakemake_executor_multinode.cli.main import main

__all__ = ["main"]
