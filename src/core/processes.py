"""Process lifetime shared by both sides: a child never outlives the process that started it."""
from __future__ import annotations

import ctypes
import os
import signal
import sys

#: prctl(2) option, from <linux/prctl.h>.
_PR_SET_PDEATHSIG = 1
# Looked up once, at import in the parent: a Popen ``preexec_fn`` runs between fork and exec,
# where loading a library (dlopen) could deadlock on a lock another thread held.
_prctl = ctypes.CDLL(None, use_errno=True).prctl if sys.platform == "linux" else None

#: Where the fork server learns which process it must not outlive.
PARENT_PID_ENV = "CNNCOMPARE_PARENT_PID"


def die_with_parent(parent: int) -> None:
    """Have the kernel SIGKILL this process when ``parent``, the process that started it, dies.

    Called first thing in every process cnncompare starts (the fork server, a
    forked cell, torchrun as ``preexec_fn``, each rank). The kernel sends the
    signal when the parent *thread* exits, so parents start children from
    their main thread (cnncompare's do). ``parent`` is the pid the starter
    had before the fork, not read afterwards: if it died before the request
    was made, we were re-parented already (to 1 or a subreaper) and exit at
    once, while a cnncompare that is itself pid 1 (in a container) still
    works. Linux only; elsewhere the parent's own cleanup
    (``run/launch.kill_tree``) remains.
    """
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)
