"""Watching jobs after submission: the run registry, each job's state, progress, reattach, status and reports.

registry (every submission of every run), tracker (exit markers and sweeps: finished, failed, requeued), reattach
(when a rerun adopts an earlier run's job), progress (the training's metrics lines), status_view (`multinode
status`), report (the efficiency report from sacct).
"""
