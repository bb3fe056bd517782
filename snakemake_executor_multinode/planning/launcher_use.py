"""Refuse a job whose GPUs or nodes nothing would use: a multi-node (or multi-GPU) rule whose command never starts
`multinode torchrun` (or a launcher named in --multinode-launchers) runs one process on the head node while the rest
of the allocation idles until the time limit. Checked before anything is submitted; own_launcher=True opts out."""

from __future__ import annotations

import os
import shlex
import shutil
from collections.abc import Sequence

from snakemake_executor_multinode.launching import stall
from snakemake_executor_multinode.planning.request import JobRequest, RequestError
from snakemake_executor_multinode.planning.settings import SettingsError

_OPERATORS = {";", "&&", "||", "|", "&", "(", ")", "{", "}", "|&", ";;", "!"}
# words that run the next word as the command (`exec multinode torchrun ...`, `time srun ...`)
_PREFIXES = {"exec", "time", "env", "nohup", "command", "builtin", "then", "do", "else", "if", "while", "until"}


def launchers_setting(value: str | None) -> tuple[str, ...]:
    """--multinode-launchers: comma-separated command names, each on PATH (SettingsError names the one that is not)."""
    names = tuple(n.strip() for n in (value or "").split(",") if n.strip())
    for name in names:
        if shutil.which(name) is None:
            raise SettingsError(
                f"--multinode-launchers={value!r}: {name!r} is not a command on PATH; give the names of the commands "
                "that start your ranks, comma-separated, e.g. accelerate,deepspeed"
            )
    return names


def command_words(command: str) -> list[list[str]]:
    """Each simple command of a shell command line as its words, the command word first (assignments and prefixes
    such as `exec` dropped)."""
    text = command.replace("\\\n", " ").replace("\n", " ; ")
    lexer = shlex.shlex(text, posix=True, punctuation_chars=";&|()<>")
    lexer.whitespace_split = True
    try:
        tokens = list(lexer)
    except ValueError:  # unbalanced quotes: the shell would refuse it too; read it word by word
        tokens = text.split()
    commands: list[list[str]] = [[]]
    for token in tokens:
        if token in _OPERATORS:
            commands.append([])
        elif commands[-1] or not _before_command(token):
            commands[-1].append(token)
    return [c for c in commands if c]


def _before_command(word: str) -> bool:
    """A variable assignment (X=1) or a prefix word, which come before the command word."""
    name = word.split("=", 1)[0]
    return word in _PREFIXES or ("=" in word and name.isidentifier())


def starts(command: str, launchers: Sequence[str]) -> bool:
    """Whether `command` runs `multinode torchrun` or one of `launchers` as a command word anywhere."""
    for words in command_words(command):
        name = os.path.basename(words[0])
        if (name == "multinode" and words[1:2] == ["torchrun"]) or name in launchers:
            return True
    return False


def site_launcher(shellcmd: str | None, launchers: Sequence[str]) -> bool:
    """Whether `shellcmd` starts its ranks with one of `launchers` (--multinode-launchers) and never with `multinode
    torchrun`: then no stall watchdog runs, so the request gets none by default."""
    return shellcmd is not None and starts(shellcmd, launchers) and not starts(shellcmd, ())


def watchdog(req: JobRequest, command: str) -> str:
    """The stall watchdog and the in-job restarts as the submission line states them (they end and restart a
    training, so the user hears of them up front). Both live in `multinode torchrun`: a job whose command does not
    run it has neither, whatever the request says."""
    if not starts(command, ()):
        return ""
    said = ""
    if req.launcher.stall_timeout_s is None:
        said = (
            f", stall watchdog adaptive ({stall.PACE_FACTOR:g}x the interval between step lines, at least "
            f"{stall.PACE_FLOOR_S:g} s; {stall.LONG_S / 60:g} min before the second step line, during a checkpoint "
            "save and without step lines; resources stall_timeout)"
        )
    elif req.launcher.stall_timeout_s:
        minutes, seconds = divmod(req.launcher.stall_timeout_s, 60)
        span = f"{minutes} min" if not seconds else f"{req.launcher.stall_timeout_s} s"
        said = f", stall watchdog {span} (resources stall_timeout; 0 turns it off)"
    if req.launcher.max_restarts:
        said += f", up to {req.launcher.max_restarts} in-job restart(s) (resources max_restarts)"
    return said


def refuse_idle(req: JobRequest, shellcmd: str | None, kind: str | None, launchers: Sequence[str]) -> None:
    """RequestError when the job asks for nodes (or GPUs on one node) that its command would leave idle. `shellcmd`:
    the rule's shell command, None for a rule without one (`kind` says what it is: script rule, run: block, ...)."""
    many_nodes, many_gpus = req.nodes > 1, req.gpus > 1
    if req.launcher.own_launcher or not (many_nodes or (many_gpus and shellcmd is not None)):
        return
    if shellcmd is not None and starts(shellcmd, launchers):
        return
    shape = f"nodes={req.nodes}, gpus={req.gpus}" if many_nodes else f"gpus={req.gpus}"
    idle = (
        f"it would run on the head node only while {req.nodes - 1} node(s) idle"
        if many_nodes
        else f"it would run one process while {req.gpus - 1} of its {req.gpus} GPUs idle"
    )
    named = "`multinode torchrun`" + (f" (nor {', '.join(launchers)})" if launchers else "")
    if shellcmd is None:
        said = f"it is a {kind or 'rule without a shell command'}, so nothing starts {named}"
        fix = "Make it a shell rule that runs `multinode torchrun train.py ...`"
    else:
        said = f"its command never starts {named}"
        fix = "Write `multinode torchrun train.py ...`, name your launcher in --multinode-launchers"
    raise RequestError(
        req.rule,
        "own_launcher",
        False,
        message=f"rule {req.rule}: {shape} but {said}: {idle}. {fix}, or set resources own_launcher=True if the "
        "script starts its ranks itself (srun, mpirun).",
    )
