"""The half of an asynchronous checkpoint save that runs beside the training (checkpoint.py, `ckpt_async`).

The training stalls only while the plugin's checkpoint IO runs with torch.save captured (`captured`): every
torch.save into the checkpoint's temp folder keeps a host-memory copy of what it was given instead of writing it
(`host_copy`: each tensor storage copied once, CUDA to host, CPU cloned; the rest deep-copied). Whatever the IO gathers
across ranks (ZeRO, gemini, tensor parallelism) it gathers then, on the training's own thread and process groups, and
its small files (the shard indexes) are written then. Writing the copies with the same torch.save, fsync, the manifest,
the rename and the verification run later on a thread (`Background`), so the training goes on while the files reach
the disk. The files are the ones a synchronous save writes: torch.save sees the same objects, views into the same
storages (the test compares the two saves' checksums).

A torch.save that a library bound under another name bypasses the capture and writes at once: such a file is still
in the temp folder, fsynced, in the manifest and verified; it only costs its write inside the stall.
"""

from __future__ import annotations

import copy
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch


def host_copy(obj: Any, memo: dict[int, Any] | None = None) -> Any:
    """`obj` with every tensor's storage copied to host memory once (views stay views of the one copy, tensors that
    share a storage still share it, so torch.save writes the same bytes), containers rebuilt and everything else
    deep-copied: nothing of it changes when the training's next step updates the live tensors in place."""
    memo = {} if memo is None else memo
    storages: dict[tuple[Any, ...], torch.UntypedStorage] = memo.setdefault(-1, {})  # -1: never an id()

    def tensor(t: torch.Tensor) -> torch.Tensor:
        if t.layout != torch.strided or t.is_quantized or t.device.type == "meta":
            return t.detach().to("cpu", copy=True)  # no storage to share: copied whole
        s = t.untyped_storage()
        key = (s.device, s.data_ptr(), s.nbytes())
        copied = storages.get(key) if s.nbytes() else None  # empty storages all sit at 0: never shared
        if copied is None:
            copied = s.clone() if s.device.type == "cpu" else s.cpu()
            if s.nbytes():
                storages[key] = copied
        out = torch.empty(0, dtype=t.dtype).set_(copied, t.storage_offset(), t.size(), t.stride())
        return torch.nn.Parameter(out, requires_grad=t.requires_grad) if isinstance(t, torch.nn.Parameter) else out

    def walk(o: Any) -> Any:
        if isinstance(o, (str, bytes, int, float, bool, type(None))):
            return o
        if id(o) in memo:
            return memo[id(o)]
        if isinstance(o, torch.Tensor):
            out: Any = tensor(o)
        elif isinstance(o, dict):
            out = copy.copy(o)  # its type (OrderedDict) and attributes (a state dict's _metadata)
            for k, v in o.items():
                out[k] = walk(v)
        elif isinstance(o, list):
            out = [walk(v) for v in o]
        elif isinstance(o, tuple):
            items = [walk(v) for v in o]
            out = type(o)(*items) if hasattr(o, "_fields") else type(o)(items)
        else:
            return copy.deepcopy(o, memo)
        memo[id(o)] = out
        return out

    return walk(obj)


@dataclass
class Capture:
    """The torch.save calls into `folder` while the capture was on: (path, host copy, torch.save's other arguments),
    and the torch.save that writes them (the one in place when the capture began)."""

    folder: Path
    save: Callable[..., Any]
    files: list[tuple[Path, Any, tuple[Any, ...], dict[str, Any]]] = field(default_factory=list)

    def write(self, writing: Callable[[Path], None]) -> None:
        """Write every captured file, oldest first; `writing(path)` is told each before it is written (the failure
        message names it). The copies are released as they are written."""
        while self.files:
            path, obj, args, kwargs = self.files.pop(0)
            writing(path)
            self.save(obj, path, *args, **kwargs)


def _inside(target: Any, folder: Path) -> bool:
    if not isinstance(target, (str, os.PathLike)):
        return False  # a file object or buffer: not one of the checkpoint's paths
    path = Path(os.fspath(target)).absolute()
    return path == folder or folder in path.parents


@contextmanager
def captured(folder: Path) -> Iterator[Capture]:
    """torch.save into `folder` (or below it) is captured for the block (module docstring); any other torch.save
    writes as usual."""
    real = torch.save
    capture = Capture(Path(folder).absolute(), real)

    def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        if _inside(f, capture.folder):
            capture.files.append((Path(os.fspath(f)), host_copy(obj), args, kwargs))
        else:
            real(obj, f, *args, **kwargs)

    torch.save = save  # type: ignore[assignment]
    try:
        yield capture
    finally:
        torch.save = real  # type: ignore[assignment]


class Background:
    """`work` on a thread of its own: its outcome (`failure`, the exception it raised) and its seconds, for `join`."""

    def __init__(self, step: int, work: Callable[[], dict[str, float]]) -> None:
        self.step = step
        self.cost: dict[str, float] = {}
        self.failure: BaseException | None = None
        self.seconds = 0.0
        self._work = work
        self._thread = threading.Thread(target=self._run, name=f"checkpoint-{step}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        t0 = time.perf_counter()
        try:
            self.cost = self._work()
        except BaseException as err:  # noqa: BLE001 - raised again on the training's thread by join()
            self.failure = err
        self.seconds = time.perf_counter() - t0

    def done(self) -> bool:
        return not self._thread.is_alive()

    def join(self) -> float:
        """Wait for the work; the seconds waited. Its failure is raised here."""
        t0 = time.perf_counter()
        self._thread.join()
        waited = time.perf_counter() - t0
        if self.failure is not None:
            raise self.failure
        return waited
