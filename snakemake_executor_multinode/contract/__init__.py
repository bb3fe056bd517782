"""The contract: what two or more stages agree on, said once, importing nothing of the stages.

protocol (markers, exit codes, MULTINODE_* variables, the port rule), jobfiles (every file of a job and every state
folder, in Python and in the job script's shell), logline (the `[node rankR]` label: written and parsed),
container_spec (a profile's `container:` key), releases (the SLURM releases we support), state_files (state read back
without trusting it), jsonl (JSON lines read tolerantly), node_events (what happened to a job's nodes).
"""
