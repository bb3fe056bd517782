"""What `multinode preview` (cli/preview.py, and the adapter's preview of a rule of the real Snakefile) prints
beside a job's script: the srun step `multinode torchrun` starts in the job, built by the launcher's own code."""

from __future__ import annotations

import re
import shlex

from snakemake_executor_multinode.contract import container_spec
from snakemake_executor_multinode.launching import launcher
from snakemake_executor_multinode.planning import environment
from snakemake_executor_multinode.planning.plan import JobPlan

_TORCHRUN = re.compile(r"\bmultinode\s+torchrun\s+(?P<args>.*)$", re.MULTILINE)
_SHELL_OPS = {";", "&&", "||", "|", ">", ">>", "2>", "&", "<"}
PLACEHOLDER_PORT = 1  # replaced by $MASTER_PORT in the text: the port is the job's


def launch_preview(plan: JobPlan, profiles: environment.ProfileSet, command: str | None) -> str:
    """For a job whose command (the rule's shell) runs `multinode torchrun`: the srun step the launcher starts,
    built by the launcher's own `launcher.plan` (container wrapping included), with placeholder allocation values.
    Empty otherwise. Printed on stderr: stdout stays exactly the script the run submits."""
    found = _TORCHRUN.search(command or "")
    if found is None:
        return ""
    try:
        words = shlex.split(found["args"], comments=True)
    except ValueError:
        return ""
    cut = next((i for i, w in enumerate(words) if w in _SHELL_OPS), len(words))
    opts, script = launcher.split_torchrun_args(words[:cut])
    req = plan.request
    nodes = tuple(f"<node{i + 1}>" for i in range(req.nodes))
    alloc = launcher.Allocation("<jobid>", nodes, req.gpus, req.cpus_per_task, "$MASTER_ADDR", PLACEHOLDER_PORT)
    box = container_spec.parse(environment.resolve(profiles, req.env_profile).get("container"), "container")
    try:
        argv = launcher.srun_command(alloc, opts, script, box=box)
    except SystemExit as refused:  # what the launcher would refuse in the job
        return f"# multinode torchrun would refuse this command: {refused}"
    at = argv.index("bash")
    task = argv[at + 2].replace(f"--master_port={PLACEHOLDER_PORT}", "--master_port=$MASTER_PORT")
    where = f"in {container_spec.describe(box)}" if box else "without a container"
    return "\n".join(
        [
            f"# ==== `multinode torchrun`'s step, as the launcher starts it in the job ({where}); not part of the",
            "# script. Placeholders: <nodeN>, $MASTER_ADDR, $MASTER_PORT (the job's); paths are the job's workdir.",
            *spares_note(req.nodes, req.spare_nodes),
            f'{shlex.join(argv[:at])} bash -c "$TASK" multinode-agent',
            "# TASK, the line each node's shell runs:",
            task,
        ]
    )


def spares_note(nodes: int, spares: int) -> list[str]:
    """What the preview says of a job with spare nodes: the step trains on `nodes` of the allocation's."""
    if not spares:
        return []
    return [
        f"# {spares} spare node(s) beyond the {nodes} the step trains on (--nodelist=<the first {nodes} not known "
        "bad>); a failed node is replaced by a spare in the same job, the training relaunched from its checkpoint"
    ]
