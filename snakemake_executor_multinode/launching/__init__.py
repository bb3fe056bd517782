"""Launching on the nodes, inside the job: `multinode torchrun` and what it runs on every node.

allocation (nodes, devices, the rendezvous address), torchrun_flags and launcher (one srun step, one torchrun per
node), nodelog (each node's labelled, whole log lines), netcheck (the network check before torchrun), liveness
(which node died), container (the training's image per node).
"""
