"""One rank of a 2-process checkpoint save with a fault (tests/training/test_disk_full.py): gloo, a fake Booster
that writes small files, no model. Saves step 1, then step 2 with the fault, and writes what happened to
<result>.rank<R>.json: the message of the WriteFailed raised (or null), whether the ranks agreed, the seconds it took.

    python save_ranks.py RANK INIT_FILE CKPT_DIR FAULT MODE RESULT

MODE: sync (ckpt_async false: the save raises) or async (the save returns once copied; the wait after it raises)

FAULT: rank1_full   rank 1's own file of step 2 fails with ENOSPC; rank 0's part succeeds
       rank0_alone  rank 0's model shard of step 2 fails with ENOSPC while rank 1 waits in a collective of the
                    plugin's save that rank 0 never joins (ZeRO's gather, say): rank 0 must leave alone
"""

from __future__ import annotations

import errno
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "workflows" / "scripts"))

import checkpoint  # noqa: E402
import diskspace  # noqa: E402
import lm  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def full(path: str) -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)


class FakeBooster:
    def __init__(self, rank: int, fault: str) -> None:
        self.rank, self.fault, self.step = rank, fault, 0

    def save_model(self, model: Any, path: str, shard: bool) -> None:
        if self.step == 2 and self.fault == "rank0_alone":
            if self.rank == 0:
                raise full(f"{path}/pytorch_model-00001.bin")
            dist.all_reduce(torch.zeros(1))  # the plugin's gather: rank 0 never comes
        if self.rank == 0:
            Path(path).mkdir()
            (Path(path) / "pytorch_model-00001.bin").write_bytes(b"m" * 4000)

    def save_optimizer(self, optimizer: Any, path: str, shard: bool) -> None:
        if self.rank == 0:
            Path(path).mkdir()
            (Path(path) / "pytorch_optim-00001.bin").write_bytes(b"o" * 8000)

    def save_lr_scheduler(self, scheduler: Any, path: str) -> None:
        if self.rank == 0:
            Path(path).write_bytes(b"s")


def main() -> int:
    rank, init, root, fault = int(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), sys.argv[4]
    mode, result = sys.argv[5], sys.argv[6]
    diskspace.AGREE_WAIT_S = 3.0
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=2)
    booster = FakeBooster(rank, fault)
    cfg = lm.merge_config({"keep_ckpts": 1, "ckpt_async": {"async": True, "sync": False}[mode]})
    ck = checkpoint.Checkpointer(booster, None, None, None, root, cfg, 2)
    booster.step = 1
    ck.save(checkpoint.TrainState(step=1))
    ck.wait()
    booster.step = 2
    real_save = torch.save
    if fault == "rank1_full" and rank == 1:

        def failing_save(obj: Any, f: Any, *a: Any, **kw: Any) -> None:
            if "step_00000002" in str(f):
                raise full(str(f))
            real_save(obj, f, *a, **kw)

        checkpoint.torch.save = failing_save  # type: ignore[assignment]
    t0 = time.monotonic()
    out: dict[str, Any] = {"message": None, "agreed": None}
    try:
        ck.save(checkpoint.TrainState(step=2))
        ck.wait()  # async: the second half's failure raises here
    except diskspace.WriteFailed as err:
        out = {"message": str(err), "agreed": err.agreed}
    out["seconds"] = time.monotonic() - t0
    # whole or not at all: the test reads the file as soon as it exists
    written = Path(f"{result}.rank{rank}.json.part")
    written.write_text(json.dumps(out))
    os.replace(written, f"{result}.rank{rank}.json")
    os._exit(0)  # no teardown: a peer may still wait in a collective (the test ends it)


if __name__ == "__main__":
    sys.exit(main())
