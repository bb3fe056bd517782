"""sbatch's command-line options, per SLURM release (contract/releases.py names them), and a reader that takes flags
the way sbatch's getopt_long does: unique prefixes of long options, bundled short options, values after '=' or in
the next word.
The session reads with the table of the release it finds (`sbatch --version`); without one (no SLURM asked, or a
release without a table here) with every option a known release has."""

from __future__ import annotations

import difflib
import re
import shlex
from dataclasses import dataclass, replace

from snakemake_executor_multinode.contract import releases

# sbatch 22.05's getopt_long table: long name -> argument ("required", "optional" or "none"). Read off the binary
# (`sbatch --a` .. `--z` list every option through getopt's "ambiguous" message; `--NAME` / `--NAME=x` tell the
# argument kind); tests/process/planning/test_request.py compares it with the installed sbatch where there is one.
SBATCH_LONG_OPTIONS: dict[str, str] = {
    **dict.fromkeys(
        "account acctg-freq array batch bb bbf begin chdir cluster cluster-constraint clusters comment constraint "
        "container context core-spec cores-per-socket cpu-freq cpus-per-gpu cpus-per-task deadline delay-boot "
        "dependency distribution error exclude export export-file extra-node-info gid gpu-bind gpu-freq gpus "
        "gpus-per-node gpus-per-socket gpus-per-task gres gres-flags hint input job-name kill-on-invalid-dep licenses "
        "mail-type mail-user mcs-label mem mem-bind mem-per-cpu mem-per-gpu mincpus network nodefile nodelist nodes "
        "ntasks ntasks-per-core ntasks-per-gpu ntasks-per-node ntasks-per-socket ntasks-per-tres open-mode output "
        "partition power prefer priority profile qos reservation signal sockets-per-node switches tasks-per-node "
        "thread-spec threads-per-core time time-min tmp uid wait-all-nodes wckey wrap".split(),
        "required",
    ),
    **dict.fromkeys("exclusive get-user-env nice no-kill propagate".split(), "optional"),
    **dict.fromkeys(
        "contiguous help hold ignore-pbs no-requeue overcommit oversubscribe parsable quiet reboot requeue "
        "spread-job test-only usage use-min-nodes verbose version wait".split(),
        "none",
    ),
}
# sbatch 24.11's (Debian 13's 24.11.5), read off the binary the same way: 22.05's without --power, and these.
SBATCH_24_11_LONG_OPTIONS: dict[str, str] = {
    **{name: kind for name, kind in SBATCH_LONG_OPTIONS.items() if name != "power"},
    **dict.fromkeys("autocomplete container-id extra segment tres-bind tres-per-task".split(), "required"),
    **dict.fromkeys("oom-kill-step resv-ports".split(), "optional"),
    "stepmgr": "none",
}
# sbatch 22.05's short options -> long name (24.11's are the same); a short option takes an argument iff its long one
# requires one (-k, --no-kill[=on|off], takes none).
SBATCH_SHORT_OPTIONS: dict[str, str] = {
    "a": "array",
    "A": "account",
    "b": "begin",
    "B": "extra-node-info",
    "c": "cpus-per-task",
    "C": "constraint",
    "d": "dependency",
    "D": "chdir",
    "e": "error",
    "F": "nodefile",
    "G": "gpus",
    "h": "help",
    "H": "hold",
    "i": "input",
    "J": "job-name",
    "k": "no-kill",
    "L": "licenses",
    "m": "distribution",
    "M": "clusters",
    "n": "ntasks",
    "N": "nodes",
    "o": "output",
    "O": "overcommit",
    "p": "partition",
    "q": "qos",
    "Q": "quiet",
    "s": "oversubscribe",
    "S": "core-spec",
    "t": "time",
    "v": "verbose",
    "V": "version",
    "w": "nodelist",
    "W": "wait",
    "x": "exclude",
}


@dataclass(frozen=True)
class OptionTable:
    """One sbatch's options: long name -> argument kind, short letter -> long name."""

    name: str  # what an error calls it: "sbatch 24.11"
    long: dict[str, str]
    short: dict[str, str]


# Each release's long options; a release of the registry without them fails here, at import.
LONG_OPTIONS = {"22.05": SBATCH_LONG_OPTIONS, "24.11": SBATCH_24_11_LONG_OPTIONS}
TABLES = {name: OptionTable(f"sbatch {name}", LONG_OPTIONS[name], SBATCH_SHORT_OPTIONS) for name in releases.NAMES}
ANY_RELEASE = OptionTable(
    f"sbatch {' or '.join(TABLES)}",
    {name: kind for table in TABLES.values() for name, kind in table.long.items()},
    SBATCH_SHORT_OPTIONS,
)


def table_for(version: str | None) -> OptionTable:
    """The table of the release SLURM names ("24.11.5" -> 24.11's); every known option for a release without one."""
    found = re.match(r"(\d+\.\d+)", version or "")
    if found and found[1] in TABLES:
        return replace(TABLES[found[1]], name=f"sbatch {version}")
    if version:
        return OptionTable(
            f"sbatch {' or '.join(TABLES)}; this cluster's is {version}", ANY_RELEASE.long, SBATCH_SHORT_OPTIONS
        )
    return ANY_RELEASE


def _resolve_long(given: str, table: OptionTable) -> str:
    """getopt_long's rule: an exact name, else a prefix of exactly one name; an ambiguous prefix is an error."""
    if given in table.long:
        return given
    candidates = [name for name in table.long if name.startswith(given)]
    if len(candidates) == 1:
        return candidates[0]
    if candidates:
        raise ValueError(f"--{given} is ambiguous to sbatch: " + ", ".join(f"--{c}" for c in sorted(candidates)))
    close = difflib.get_close_matches(given, table.long, n=3)
    hint = f"; did you mean {' or '.join('--' + c for c in close)}?" if close else ""
    raise ValueError(f"--{given} is not an sbatch option ({table.name}){hint}")


def parse_sbatch_flags(text: str, table: OptionTable = ANY_RELEASE) -> list[tuple[str, str, str | None]]:
    """Read sbatch flags the way sbatch does (getopt_long): unique prefixes of long options, bundled short options,
    values after '=' or in the next word. Returns (as written, long name, value or None) per option; ValueError for
    what sbatch would refuse, for words that are not options (sbatch would take the first as the script) and for
    control characters (a newline would end the #SBATCH line)."""
    bad = next((c for c in text if ord(c) < 32 or ord(c) == 127), None)
    if bad is not None:
        raise ValueError(f"control character {bad!r}: it must be one line of sbatch flags")
    try:
        words = shlex.split(text)
    except ValueError as err:
        raise ValueError(f"must be shell-style flags ({err})") from err
    options: list[tuple[str, str, str | None]] = []
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if word == "--" or word == "-" or not word.startswith("-"):
            raise ValueError(
                f"{word!r} is not an option: only sbatch flags may follow (sbatch reads a word as the script)"
            )
        if word.startswith("--"):
            given, sep, value = word[2:].partition("=")
            name = _resolve_long(given, table)
            kind = table.long[name]
            if sep and kind == "none":
                raise ValueError(f"--{name} takes no value")
            if not sep and kind == "required":
                if i == len(words):
                    raise ValueError(f"--{name} needs a value")
                value, sep = words[i], "="
                i += 1
            options.append((f"--{given}", name, value if sep else None))
            continue
        if len(word) > 2 and word[1:].partition("=")[0] in table.long:
            long = word[1:].partition("=")[0]
            raise ValueError(f"sbatch reads {word} as -{word[1]} {word[2:]}; write --{long} (two dashes)")
        j = 1
        while j < len(word):
            letter = word[j]
            j += 1
            if letter not in table.short:
                raise ValueError(f"-{letter} is not an sbatch option ({table.name})")
            name = table.short[letter]
            if table.long[name] != "required":
                options.append((f"-{letter}", name, None))
                continue
            if j < len(word):
                value = word[j:]
            elif i < len(words):
                value = words[i]
                i += 1
            else:
                raise ValueError(f"-{letter} (--{name}) needs a value")
            options.append((f"-{letter}", name, value))
            break
    return options
