"""The SLURM releases we support, named once. sbatch's option tables (slurm/sbatch_flags.py), the sandbox's ways of
running each (sandbox/releases.py), `multinode cluster up --slurm` and scripts/test.sh (which asks
`python3 -m snakemake_executor_multinode.contract.releases`) all read this list.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class SlurmRelease:
    name: str  # as `--slurm` takes it and `sbatch --version` begins ("24.11" for 24.11.5)
    description: str  # where the sandbox's SLURM of this release comes from, for help texts


RELEASES = {
    r.name: r
    for r in (
        SlurmRelease("22.05", "this machine's Debian 12 packages"),
        SlurmRelease("24.11", "a Debian 13 root file system"),
    )
}
NAMES = tuple(RELEASES)
DEFAULT = "22.05"  # the sandbox's and the test suite's release when none is asked for


def main() -> int:
    """scripts/test.sh's question: the names, one a line, the default first."""
    print("\n".join([DEFAULT, *(n for n in NAMES if n != DEFAULT)]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
