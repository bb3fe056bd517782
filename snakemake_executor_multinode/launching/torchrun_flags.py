"""torchrun's command-line flags, without importing torch (1.5-4 s on every node just to split a command line).

`TAKES_VALUE` is torchrun's option table (name -> whether it takes a value) for the torch pinned in
constraints.txt; tests/unit/launching/test_launcher.py checks it against torch's own parser,
`torch.distributed.run.get_args_parser()`, so a torch upgrade that adds or changes a flag fails that test instead of a
user's run.
"""

from __future__ import annotations

from collections.abc import Sequence

TAKES_VALUE: dict[str, bool] = {
    "-h": False,
    "--help": False,
    "--nnodes": True,
    "--nproc-per-node": True,
    "--nproc_per_node": True,
    "--rdzv-backend": True,
    "--rdzv_backend": True,
    "--rdzv-endpoint": True,
    "--rdzv_endpoint": True,
    "--rdzv-id": True,
    "--rdzv_id": True,
    "--rdzv-conf": True,
    "--rdzv_conf": True,
    "--standalone": False,
    "--max-restarts": True,
    "--max_restarts": True,
    "--monitor-interval": True,
    "--monitor_interval": True,
    "--start-method": True,
    "--start_method": True,
    "--event-log-handler": True,
    "--event_log_handler": True,
    "--role": True,
    "-m": False,
    "--module": False,
    "--no-python": False,
    "--no_python": False,
    "--run-path": False,
    "--run_path": False,
    "--log-dir": True,
    "--log_dir": True,
    "-r": True,
    "--redirects": True,
    "-t": True,
    "--tee": True,
    "--local-ranks-filter": True,
    "--local_ranks_filter": True,
    "--duplicate-stdout-filters": True,
    "--duplicate_stdout_filters": True,
    "--duplicate-stderr-filters": True,
    "--duplicate_stderr_filters": True,
    "--node-rank": True,
    "--node_rank": True,
    "--master-addr": True,
    "--master_addr": True,
    "--master-port": True,
    "--master_port": True,
    "--local-addr": True,
    "--local_addr": True,
    "--logs-specs": True,
    "--logs_specs": True,
    "--numa-binding": True,
    "--numa_binding": True,
    "--signals-to-handle": True,
    "--signals_to_handle": True,
    "--shutdown-timeout": True,
    "--shutdown_timeout": True,
    "--virtual-local-rank": False,
    "--virtual_local_rank": False,
}


def split_torchrun_args(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """(torchrun options, [script, *script args]): options end at the first word that is not one (or at `--`)."""
    i = 0
    while i < len(argv):
        token = argv[i]
        if token == "--":
            return list(argv[:i]), list(argv[i + 1 :])
        if not token.startswith("-") or token == "-":
            break
        name, attached = token.split("=", 1)[0], "=" in token
        if name not in TAKES_VALUE and not token.startswith("--") and token[:2] in TAKES_VALUE:
            name, attached = token[:2], True  # a short option with its value attached: -t3
        if name not in TAKES_VALUE:
            raise SystemExit(f"multinode torchrun: unknown torchrun option {token!r}")
        i += 1 if (attached or not TAKES_VALUE[name]) else 2
    if i >= len(argv):
        raise SystemExit("multinode torchrun: no training script given (usage: multinode torchrun [opts] SCRIPT)")
    return list(argv[:i]), list(argv[i:])


def option_value(opts: Sequence[str], *names: str) -> str | None:
    """The value of the first of `names` given in `opts` (`--name value` or `--name=value`), else None."""
    for i, token in enumerate(opts):
        for name in names:
            if token == name and i + 1 < len(opts):
                return opts[i + 1]
            if token.startswith(name + "="):
                return token.split("=", 1)[1]
    return None
