"""Watching jobs after submission: the run registry, each job's state, progress, reattach, status, logs, reports and
clean (docs/design.md: its modules)."""
