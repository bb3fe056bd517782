"""slurm_extra is read as sbatch reads it (getopt_long): unique prefixes, bundled short options, values after = or
in the next word; what sbatch would refuse or misread is refused here, before anything is submitted."""

from __future__ import annotations

import pytest

from snakemake_executor_multinode.slurm.sbatch_flags import parse_sbatch_flags


def test_flags_are_read_with_their_long_names_and_values():
    assert parse_sbatch_flags("--exclusive -C a100 --mail-type=END") == [
        ("--exclusive", "exclusive", None),
        ("-C", "constraint", "a100"),
        ("--mail-type", "mail-type", "END"),
    ]


@pytest.mark.parametrize(
    "text, said",
    [
        ("--mail", "ambiguous"),  # --mail-type or --mail-user: sbatch refuses it too
        ("--ntasks=2\n#SBATCH --nodes=9", "control character"),  # would end the #SBATCH line
        ("script.sh", "is not an option"),  # sbatch would take it as the script
        ("--no-such-flag", "is not an sbatch option"),
    ],
)
def test_what_sbatch_would_refuse_or_misread_is_refused(text, said):
    with pytest.raises(ValueError, match=said):
        parse_sbatch_flags(text)
