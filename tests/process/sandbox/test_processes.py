"""`multinode cluster down` returns once the daemons it stopped are gone from the process table, not merely dead:
a daemon is init's child, and a dead one stays a zombie (listed by pgrep) until init reaps it."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

from snakemake_executor_multinode.sandbox import processes
from tests.helpers import wait_for


def state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def test_stop_waits_until_the_dead_process_is_reaped():
    # this test plays init: the child stays a zombie until the test reaps it
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    stopper = threading.Thread(target=processes.stop, args=([child.pid],))
    stopper.start()
    wait_for(lambda: state(child.pid) == "Z", "the child dead (a zombie)", 30)
    stopper.join(0.5)
    assert stopper.is_alive()  # dead but not reaped: not gone yet
    child.wait()  # reaped
    stopper.join(30)
    assert not stopper.is_alive() and state(child.pid) == "gone"
