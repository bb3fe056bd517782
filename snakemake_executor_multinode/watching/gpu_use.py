"""Each node's GPU use so far, from the samples the job script's sampler step writes beside the job's log
(protocol.gpu_samples: nvidia-smi's CSV of protocol.GPU_QUERY, one line per GPU and sample): the mean utilisation over
every sample of every GPU of the node, and the highest memory any one GPU of it held, of that GPU's total. Read from the
shared filesystem; nothing asks SLURM or the nodes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from snakemake_executor_multinode.contract.jobfiles import JobFiles
from snakemake_executor_multinode.contract.protocol import GPU_QUERY

_UTIL, _USED, _TOTAL = (GPU_QUERY.index(k) for k in ("utilization.gpu", "memory.used", "memory.total"))


@dataclass(frozen=True)
class NodeGpus:
    samples: int  # lines read (one per GPU and sample)
    mean_util: float | None  # percent; None where no line said it ([N/A], [Not Supported])
    peak_mem_mib: float | None
    total_mem_mib: float | None  # of the GPU that held the peak

    def describe(self) -> str:
        util = f"{self.mean_util:.0f}%" if self.mean_util is not None else "-"
        if self.peak_mem_mib is None:
            return f"util {util} mem -"
        total = f"/{gib(self.total_mem_mib)}" if self.total_mem_mib else ""
        return f"util {util} mem {gib(self.peak_mem_mib)}{total} GiB"


def gib(mib: float) -> str:
    return f"{mib / 1024:.1f}"


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None  # [N/A], [Not Supported], a line cut by the sampler's end


def read(path: Path) -> NodeGpus | None:
    """One node's samples; None while it has none."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return None
    utils: list[float] = []
    peak: tuple[float, float | None] | None = None
    samples = 0
    for line in text.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != len(GPU_QUERY):
            continue
        samples += 1
        if (util := _number(fields[_UTIL])) is not None:
            utils.append(util)
        used = _number(fields[_USED])
        if used is not None and (peak is None or used > peak[0]):
            peak = (used, _number(fields[_TOTAL]))
    if not samples:
        return None
    return NodeGpus(
        samples, sum(utils) / len(utils) if utils else None, peak[0] if peak else None, peak[1] if peak else None
    )


def for_log(log: str | Path | None) -> dict[str, NodeGpus]:
    """Every sampled node of the job whose first log is `log`, by node name."""
    if not log:
        return {}
    found = {node: read(path) for node, path in JobFiles.from_log(log).gpu_samples_by_node().items()}
    return {node: use for node, use in found.items() if use is not None}


def describe(nodes: dict[str, NodeGpus]) -> str:
    """`node1 util 47% mem 29.3/79.6 GiB, node2 util 51% mem 30.1/79.6 GiB`"""
    return ", ".join(f"{node} {use.describe()}" for node, use in nodes.items())
