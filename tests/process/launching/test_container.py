"""Containers per environment profile: the job script's variables read back on the nodes, and each runtime's
rendering (what a profile may say: tests/unit/contract/test_container_spec.py).

The podman rendering runs for real in test_container_cluster.py; pyxis and apptainer are checked here as rendered.

Here the tests that start processes (the process tier); the others: tests/unit/launching/test_container.py."""

from __future__ import annotations

from snakemake_executor_multinode.cli import main


def test_preview_shows_the_wrapped_per_node_line(tmp_path, capsys):
    path = tmp_path / "p.yaml"
    path.write_text("profiles:\n  box: {container: {runtime: apptainer, image: /img/t.sif}}\n")
    code = main(
        [
            "preview",
            "--profile-file",
            str(path),
            "--workdir",
            str(tmp_path),
            "nodes=2",
            "gpus=2",
            "env_profile=box",
            "--",
            "multinode",
            "torchrun",
            "train.py",
            "--epochs",
            "3",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0
    assert "export MULTINODE_CONTAINER_RUNTIME=apptainer" in out and "apptainer exec" not in out  # stdout: the script
    assert "`multinode torchrun`'s step" in err and "in apptainer image /img/t.sif" in err
    assert "srun --nodes=2 --ntasks=2 --ntasks-per-node=1" in err
    assert "apptainer exec --nv --bind" in err and "train.py --epochs 3" in err and "$MASTER_PORT" in err
    assert main(["preview", "nodes=2", "own_launcher=True", "--", "echo", "hi"]) == 0
    assert "torchrun's step" not in capsys.readouterr().err  # no launcher, no step
