"""Process memory readings for one cell's child.

Peak RSS per phase on Linux: ``VmHWM`` from ``/proc/self/status`` is the
high-water mark, and writing ``5`` to ``/proc/self/clear_refs`` resets it to
the current RSS, so compile + first step, the warm-up and the measured steps
get separate peaks (``PhasePeaks``, with CUDA's allocator peaks beside them).
Elsewhere only the lifetime peak (``ru_maxrss``) is known. Compile workers are
processes of their own: ``DescendantsPeak`` samples them.

RSS carries the C library's heap, which differs between identical processes by several per cent;
``allocated_peak_mb`` measures what a step holds allocated instead, the same to 0.01 % in every
process that runs the same code (what a row's memory is compared with eager's by, on the CPU).
"""
from __future__ import annotations

import ctypes
import resource
import sys
import threading
from typing import TYPE_CHECKING, Callable, Optional

import psutil

if TYPE_CHECKING:
    import torch

_MB = 1024 * 1024


def current_rss_mb() -> float:
    return psutil.Process().memory_info().rss / _MB


def _vmhwm_mb() -> Optional[float]:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return None


def peak_rss_mb() -> float:
    """Peak RSS since the last reset (or process start)."""
    hwm = _vmhwm_mb()
    if hwm is not None:
        return hwm
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return maxrss / _MB if sys.platform == "darwin" else maxrss / 1024  # bytes on macOS, KiB on Linux


def reset_peak_rss() -> bool:
    """Reset the high-water mark to the current RSS; False where the OS can't."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return _vmhwm_mb() is not None
    except OSError:
        return False


class DescendantsPeak:
    """Peak summed RSS of this process's descendants (inductor's compile workers), sampled.

    Compile workers are processes of their own, outside the cell's ``VmHWM``; a daemon thread
    samples them every ``interval_s`` from ``start()`` to ``stop()`` (compile, first step and
    warm-up: the measured steps run without it, so it costs them nothing).
    """

    def __init__(self, interval_s: float = 0.1):
        self.interval_s = interval_s
        self.peak_mb = 0.0
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def start(self) -> "DescendantsPeak":
        self._thread = threading.Thread(target=self._run, name="cnncompare-descendants", daemon=True)
        self._thread.start()
        return self

    def sample(self) -> None:
        total = 0
        for child in psutil.Process().children(recursive=True):
            try:
                total += child.memory_info().rss
            except psutil.Error:  # exited between the listing and the reading
                pass
        self.peak_mb = max(self.peak_mb, total / _MB)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval_s)

    def stop(self) -> Optional[float]:
        """The peak in MB; None when no descendant was ever seen."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            self.sample()
        return self.peak_mb or None


class PhasePeaks:
    """The process's peak RSS and (on CUDA) the caching allocator's peaks, phase by phase."""

    def __init__(self, cuda_device: Optional["torch.device"]):
        self.device = cuda_device

    def take(self) -> tuple[float, Optional[float], Optional[float]]:
        """(peak RSS, CUDA peak allocated, CUDA peak reserved) in MB since the last reset."""
        if self.device is None:
            return peak_rss_mb(), None, None
        import torch

        return (peak_rss_mb(), torch.cuda.max_memory_allocated(self.device) / _MB,
                torch.cuda.max_memory_reserved(self.device) / _MB)

    def reset(self) -> bool:
        """Start a new phase; False where the OS can't reset the RSS peak (it then keeps the lifetime's)."""
        if self.device is not None:
            import torch

            torch.cuda.reset_peak_memory_stats(self.device)
        return reset_peak_rss()


def process_usage() -> resource.struct_rusage:
    """This process's CPU time and page faults so far (all its threads)."""
    return resource.getrusage(resource.RUSAGE_SELF)


def per_step_usage(before: resource.struct_rusage, after: resource.struct_rusage,
                   steps: int) -> tuple[float, float, float]:
    """What the measured steps cost the OS, per step: (user CPU s, kernel CPU s, page faults),
    all threads. On the CPU a large kernel share is mostly page faults: fresh
    tensors above glibc's mmap threshold are mapped and zeroed by the kernel on every step
    (eager's for-loop Adam and a freed ``.grad`` re-allocate hundreds of MB per step)."""
    n = max(steps, 1)
    return ((after.ru_utime - before.ru_utime) / n, (after.ru_stime - before.ru_stime) / n,
            ((after.ru_minflt - before.ru_minflt) + (after.ru_majflt - before.ru_majflt)) / n)


# mallopt(3) parameters, from glibc's <malloc.h>.
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4


def use_malloc(policy: str) -> None:
    """Apply ``policy`` to this process's allocator; call before the cell allocates tensors.

    ``reuse``: no allocation is served by its own ``mmap`` (above glibc's threshold, 128 KiB
    growing to 32 MiB, each one is, and ``free`` unmaps it), and the heap's top is never
    trimmed back to the kernel. Freed blocks stay in the process for the next step, so RSS no
    longer falls between steps, and fragmentation of the one heap can raise the peak (the
    report's peak RSS shows by how much).
    The policy was checked against this platform before any cell ran
    (``RunConfig.check_here``). Raises OSError where the C library refuses.
    """
    if policy == "system":
        return
    import ctypes

    libc = ctypes.CDLL(None)
    # mallopt returns 1 on success, 0 on a refused value.
    if not (libc.mallopt(_M_MMAP_MAX, 0) and libc.mallopt(_M_TRIM_THRESHOLD, 2**31 - 1)):
        raise OSError("glibc's mallopt refused M_MMAP_MAX=0 / M_TRIM_THRESHOLD")


class _MallInfo2(ctypes.Structure):
    """glibc's ``struct mallinfo2`` (2.33 and newer): every field a ``size_t``."""

    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                      "fsmblks", "uordblks", "fordblks", "keepcost")]


def _heap_in_use_mb() -> Optional[float]:
    """Bytes the C library has handed out and not had back, every arena and mapping summed
    (``mallinfo2``: ``uordblks + hblkhd``); None without glibc 2.33 or newer."""
    try:
        mallinfo2 = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return None
    mallinfo2.restype = _MallInfo2
    info = mallinfo2()
    return (info.uordblks + info.hblkhd) / _MB


def heap_in_use_known() -> bool:
    """Whether this process's C library says what it has handed out (``allocated_peak_mb`` can run)."""
    return _heap_in_use_mb() is not None


#: The profiler's range around the step ``allocated_peak_mb`` measures.
_MEASURED = "cnncompare.allocated_peak"


def allocated_peak_mb(step: Callable[[], object]) -> Optional[float]:
    """The most memory the process holds allocated during one step: what the C library has handed
    out when the step begins, plus the largest rise of tensor bytes in it (``torch.profiler``'s
    memory events). Runs ``step`` twice, untimed: the first makes every block the second frees
    one the profiler saw allocated (a block from before it has no size to subtract). None where
    the C library can't say (not glibc 2.33+) or the profiler records no CPU memory.

    Unlike the steady peak RSS, it has no heap in it: identical processes agree to 0.01 %
    (RSS scatters by several per cent between them), so a ratio of two rows is the backends'
    difference alone. The CPU's counterpart of CUDA's ``max_memory_allocated``; the step's
    Python objects and a backend's own C++ buffers are in the starting figure, a step's
    temporary tensors in the rise."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    if not heap_in_use_known():
        return None
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
        start = _heap_in_use_mb()
        with record_function(_MEASURED):
            step()
    events = list(prof.profiler.kineto_results.events()) if prof.profiler and prof.profiler.kineto_results else []
    measured = [e for e in events if e.name() == _MEASURED]
    memory = sorted((e for e in events if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU),
                    key=lambda e: e.start_ns())
    if start is None or not measured or not memory:
        return None
    begins, ends = measured[0].start_ns(), measured[0].end_ns()
    held = rise = at_start = 0
    for event in memory:
        if event.start_ns() > ends:
            break
        held += event.nbytes()
        if event.start_ns() >= begins:
            rise = max(rise, held - at_start)
        else:
            at_start = held
    return start + rise / _MB

