"""Process lifetime shared by both sides: a child never outlives the process that started it."""
from __future__ import annotations

import ctypes
import os
import signal
import sys

#: prctl(2) option, from <linux/prctl.h>.
_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Have the kernel SIGKILL this process when the process that started it dies.

    Called first thing in every process cnncompare starts (the fork server, a
    forked cell, torchrun as ``preexec_fn``, each rank). The kernel sends the
    signal when the parent *thread* exits, so parents start children from
    their main thread (cnncompare's do). If the parent died before the
    request was made, we were re-parented already: exit at once. Linux only;
    elsewhere the parent's own cleanup (``run/launch.kill_tree``) remains.
    """
    parent = os.getppid()
    if sys.platform == "linux":
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if parent == 1 or os.getppid() != parent:
        os._exit(1)
