"""The plugin's settings are declared once, each by the stage that reads it, and composed by the session: the
request's defaults, `multinode preview`'s flags and Snakemake's `--multinode-*` options all read their defaults from
that declaration.

Here the tests that start processes (the process tier); the others: tests/unit/planning/test_settings.py."""

from __future__ import annotations

import os
import re
import subprocess


def test_snakemake_help_ends_every_multinode_option_with_its_default():
    help_text = subprocess.run(
        ["snakemake", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        env={**os.environ, "COLUMNS": "1000"},
    ).stdout
    # each option: its line, then its help (argparse's layout), up to the next option
    blocks = re.split(r"\n  (?=-)", help_text)
    options = {block.split()[0]: " ".join(block.split()) for block in blocks if block.startswith("--multinode-")}
    assert options["--multinode-submit-burst"].endswith("(default: 30) [env var: SNAKEMAKE_MULTINODE_SUBMIT_BURST]")
    assert "(default: 300) [env var:" in options["--multinode-crash-loop-seconds"]  # 300.0 reads as 300
    assert "(default: gres) [env var:" in options["--multinode-gpu-flag"]
    assert "(default: none) [env var:" in options["--multinode-profile-file"]
    assert "(default: off) [env var:" in options["--multinode-no-arrays"]
    assert all("(default: " in line for line in options.values()), options
