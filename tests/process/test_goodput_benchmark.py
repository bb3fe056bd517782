"""benchmarks/goodput.py's recipes, as the scripts it submits: bash that parses (bash -n starts a process: here, not
in tests/unit), the competent team's additions in its script and not in the seed's."""

from __future__ import annotations

import argparse
import subprocess

from tests.helpers import REPO, load_script

goodput = load_script(REPO / "benchmarks" / "goodput.py", "goodput_bench_scripts")


def test_the_recipes_scripts_are_bash_that_parses_and_the_competent_one_adds_what_a_team_adds(tmp_path):
    args = argparse.Namespace(steps=600, ckpt_every=50, limit_min=15, pg_timeout_s=60.0, deadline_s=10)
    for name, cls in (("recipe", goodput.Recipe), ("competent", goodput.Competent)):
        variant = cls.__new__(cls)  # no cluster: only the script it would submit
        goodput.Variant.__init__(variant, None, "quiet", name, tmp_path, tmp_path / "data", args)
        script = tmp_path / f"{name}.sh"
        script.write_text(variant.script())
        assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0, script.read_text()
        text = script.read_text()
        if name == "competent":
            assert "#SBATCH --signal=B:USR2@120" in text and "srun --kill-on-bad-exit=1" in text
            assert "trap '" in text and "kill -USR2 $SRUN" in text
            assert '"collective_timeout_s": 60.0' in (tmp_path / "quiet" / "competent" / "rank.sh").read_text()
        else:
            assert "#SBATCH --signal=USR2@120" in text and "kill-on-bad-exit" not in text and "trap" not in text
            assert "collective_timeout_s" not in text
