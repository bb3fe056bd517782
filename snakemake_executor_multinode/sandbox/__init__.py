"""The local SLURM sandbox: a real slurmctld + N namespaced slurmd nodes on one machine."""

from .spec import DEFAULT_DIR, ClusterError, ClusterSpec

__all__ = ["DEFAULT_DIR", "ClusterError", "ClusterSpec"]
