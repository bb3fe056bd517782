"""Launching on the nodes, inside the job: `multinode torchrun` and what it runs on every node (docs/design.md: its
modules)."""
