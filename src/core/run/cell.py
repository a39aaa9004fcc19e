"""One cell, from the parent's side: start its child (or children), drive its warm pair, and
turn how it ended into the report's row; the device's parity reference, computed once.

Isolation is the point: a crash, hang or memory blow-up in one backend costs that cell alone,
and each cell's peak memory is its own. Each cell gets a fresh compile cache directory, so
compile times are cold (``--compile-cache warm`` runs it twice sharing one). Starting and
supervising a child is ``launch.py``'s; which cells run, in which rounds, is ``orchestrate.py``'s.

Before a device's first cell, the parity reference every cell on it is judged against is
computed in a child of its own (``cell/reference.py``), clean of any backend's settings.

With ``--nproc N`` a cell is the torchrun job and then, when it is ``ok``, the backend in one
process with one rank's threads and batch: the single-process throughput that scaling
efficiency divides by, measured in the same run.
"""
from __future__ import annotations

import functools
import os
import random
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Optional

from ...backends import base
from ..config import RunConfig
from ..records import CacheArtifacts, CellRecord, ReferenceInfo, ReferencePlan, Status
from ..results import CellResult
from . import torchrun
from .devices import DeviceSlot
from .launch import Child, Outcome, PhaseCallback, spawn
from .pairs import WAKE_S, Peer, PeerLost, Stopped, interleave, unsupervised
from .progress import Progress


@dataclass
class Pairing:
    """How a round pairs each backend's serving cell with eager: once the cell is warm, the parent
    starts a fresh eager process for it (``start_eager(warmup)``, warming up the same steps the
    cell did), and once that one is warm too, ``drive`` interleaves ``steps`` step pairs, ``chunk``
    steps at a time (``pairs.interleave``, ``pairs.round_size``). Every pair is then two fresh
    processes with the same history: one eager process shared by a round's cells got faster with
    the steps it had served, and each cell paired after the first measured slower against it
    (docs/verdicts.md, "Where the A/A bias came from").

    After ``drive``: ``eager_samples``, eager's side of the pairs (None: the cell's steps were
    served unpaired, the eager process having failed before it was warm or been lost), and
    ``eager_outcome``, how that process ended (its record: its memory, measured as the cell's)."""

    start_eager: Callable[[int], Child]
    steps: int
    rng: random.Random
    timeout_s: float
    chunk: int = 1
    eager_samples: Optional[list[float]] = None
    eager_outcome: Optional[Outcome] = None

    def drive(self, peer: Peer, killed: Callable[[], bool] = lambda: False) -> None:
        """Serve the pairs of ``peer``'s cell, ``killed`` saying whether that cell was killed.
        While the parent drives the pairs it isn't ``_watch``ing either child, so both are held
        to ``--max-memory`` here, about every ``WAKE_S``: while it waits on a step
        (``Peer.waiting``) and between chunks of steps (a step that leaks would otherwise reach
        the machine's limit first). Not more often: the look walks both process trees while the
        other process's steps are being timed."""
        self.eager_samples = self.eager_outcome = None
        twin = self.start_eager(peer.warmup)
        try:
            eager = twin.wait_ready()
            self._drive(peer, killed, eager, twin.killed)
        except BaseException:
            twin.close()
            raise
        self.eager_outcome = twin.finish()

    def _drive(self, peer: Peer, killed: Callable[[], bool], eager: Optional[Peer],
               eager_killed: Callable[[], bool]) -> None:
        last = time.monotonic()
        # The processes being driven, each with its check; eager's only while it is paired.
        watched = [(peer, killed)]
        if eager is not None and not eager.lost:
            watched.append((eager, eager_killed))

        def supervise(current: Optional[Peer] = None) -> None:
            """Look at both processes (at most every ``WAKE_S``); stop waiting on ``current``
            if it was killed, or between steps (``current`` None) if either was. A healthy
            peer's step in flight is waited for, so its replies stay in step with its requests."""
            nonlocal last
            if time.monotonic() - last >= WAKE_S:
                last = time.monotonic()
                for p, check in watched:
                    if not p.lost and check():
                        p.lost = True
            if any(p.lost for p, _ in watched if current is None or p is current):
                raise Stopped("a process of the pair was killed (--max-memory)")

        peers = [p for p, _ in watched]
        for p in peers:
            p.waiting = functools.partial(supervise, p)
        try:
            self._serve(peer, watched, supervise)
        finally:
            for p in peers:
                p.waiting = unsupervised

    def _serve(self, peer: Peer, watched: list, supervise: Callable[[], None]) -> None:
        """``drive``'s pairs (or, without a live eager process, ``peer``'s steps alone)."""
        if len(watched) == 2:
            eager = watched[1][0]
            try:
                _, self.eager_samples = interleave(peer, eager, self.steps, self.rng, self.timeout_s, self.chunk,
                                                   supervise)
                return
            except PeerLost:
                self.eager_samples = None
                if peer.lost:  # the backend's cell ended: its record says why
                    return
                del watched[1:]  # eager was lost: the rest unpaired
        try:
            served = 0
            while served < self.steps:
                served += len(peer.steps(min(self.chunk, self.steps - served), self.timeout_s))
                supervise()
        except PeerLost:
            pass


def summarize(r: CellResult) -> str:
    """The one line the progress display prints when a cell ends."""
    if r.step_s is not None and r.status in (Status.OK, Status.FAIL_ACCURACY):
        text = (f"{r.status.value}  median {r.step_s.median:.4g} s/step, compile {r.compile_s:.3g} s, "
                f"first step {r.first_step_s:.3g} s")
    else:
        text = r.status.value
    d = r.distributed
    if d is not None and d.scaling_efficiency is not None:
        text += (f", {d.nproc} ranks {d.global_images_per_s:.4g} samples/s, "
                 f"scaling efficiency {d.scaling_efficiency:.2f}")
    if r.error:
        text += f"  ({r.error.splitlines()[0][:160]})"
    return text + (f"  [{r.wall_s:.0f} s]" if r.wall_s else "")


def run_cell(backend: Any, plugin: Optional[str], slot: DeviceSlot, config: RunConfig, run_dir: Optional[str] = None,
             on_phase: PhaseCallback = Progress().phase, workload: Any = None, cache_dir: Optional[str] = None,
             judge: bool = True, pairing: Optional["Pairing"] = None) -> CellResult:
    """Measure one cell; never raises for a backend's failure (that is a result).

    ``cache_dir`` is the cell's compile cache (None: a fresh one, so the compile is cold);
    ``judge`` False measures time and memory only (a later round: no parity, no DDP
    single-process run). ``pairing``: the cell serves its measured steps, paired with a fresh
    eager process of its own (``Pairing``); the row's ``round_eager_samples`` holds eager's side, and
    in round 1 (``judge``) its ``eager_*_steady_mb`` that process's steady peaks.

    ``workload`` is the config's workload object; None looks it up through the plugins."""
    if workload is None:
        from ...plugins import load_registry

        workload = load_registry().workloads[config.workload.name]
    row = row_fields(backend, plugin, slot, config)
    reason = slot.unavailable or unavailable(backend, slot.name, config)
    if reason:
        return CellResult(status=Status.SKIPPED, error=reason, **{**row, "compile_cache": None})
    if run_dir is None:  # a cell on its own: a run directory of its own, with its reference
        with tempfile.TemporaryDirectory(prefix="cnncompare-run-") as own:
            info = ensure_reference([backend], workload, slot, config, own) if judge else None
            result = run_cell(backend, plugin, slot, config, own, on_phase, workload, cache_dir, judge, pairing)
            if result.parity is not None:
                result.parity.reference_s = paid(info)
            return result
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="cnncompare-cell-") as cell_dir:
        outcome, cold, portable = _measure(backend, workload, slot.name, config, cell_dir, run_dir, on_phase,
                                           cache_dir or os.path.join(cell_dir, "compile-cache"), judge, pairing)
        result = result_of(outcome, config, row)
        if pairing is not None and result.step_s is not None:  # drive reset them when the pairs began
            paired = pairing.eager_samples
            result.round_eager_samples = [paired if paired and len(paired) == result.step_s.n else []]
            eager = pairing.eager_outcome.record if pairing.eager_outcome and paired else None
            if judge and eager is not None:  # memory like for like: the same phase of the same kind of process
                result.eager_peak_rss_steady_mb = eager.peak_rss_steady_mb
                result.eager_cuda_peak_allocated_steady_mb = eager.cuda_peak_allocated_steady_mb
                result.eager_cuda_peak_reserved_steady_mb = eager.cuda_peak_reserved_steady_mb
        if cold is not None and cold.record is not None:
            result.cold_compile_s, result.cold_first_step_s = cold.record.compile_s, cold.record.first_step_s
        if cold is not None and cold.succeeded and portable is None and not _saves_portable_caches():
            result.notes.append("no start from a portable cache: this torch has no "
                                "torch.compiler.save_cache_artifacts (torch 2.7 and newer have it)")
        if portable is not None and portable.record is not None:
            p = portable.record
            result.portable_compile_s, result.portable_first_step_s = p.compile_s, p.first_step_s
            result.portable_cache_mb, result.portable_status = p.artifacts_mb, p.status.value
        if config.distributed and judge and result.status == Status.OK and result.distributed is not None:
            # Scaling efficiency's denominator; a failed DDP cell has no efficiency to compute.
            alone = config.single_process()
            single, _, _ = _measure(backend, workload, slot.name, alone, os.path.join(cell_dir, "single"), run_dir,
                                 lambda name, done, total: on_phase(f"single-process-{name}", done, total),
                                 os.path.join(cell_dir, "single-compile-cache"), judge=False)
            one = result_of(single, alone, row)
            result.distributed = replace(
                result.distributed, single_process_status=one.status.value,
                single_process_step_median_s=one.step_s.median if one.status == Status.OK and one.step_s else None,
                single_process_threads=one.threads, single_process_error=one.error)
    result.wall_s = time.perf_counter() - start
    if result.status == Status.FAIL_COMPILE and plugin and result.error:
        result.error = f"plugin {plugin!r}: {result.error}"
    return result


#: References this process has made available, by what they depend on (``_reference_key``): a
#: library user (or the test suite) running job after job on the same workload, config and
#: device gets each once. Each is a directory (in the cache, or one of this process's removed
#: when it exits) and how it was had; a run's directory links to its files.
_REFERENCES: dict[str, tuple[str, Optional[ReferenceInfo]]] = {}


def _reference_key(workload: Any, slot: DeviceSlot, config: RunConfig, plan: ReferencePlan) -> str:
    import json

    from . import reference_cache

    job = {k: v for k, v in config.to_dict().items() if k not in reference_cache.NOT_KEYED}
    # Which cache it came from: a process that moves the cache (a test, a library user) must not
    # be handed an entry of the old one.
    where = str(reference_cache.root()) if config.reference_cache else None
    return json.dumps([slot.name, workload.name, job, plan.__dict__, where], sort_keys=True, default=str)


def _still_there(where: str, device: str) -> bool:
    """Whether a remembered reference directory still holds the reference or its error: a cache
    entry can be evicted, deleted by hand or lie in a removed temporary directory while this
    process still remembers it."""
    from ..cell.reference import paths

    tensors, meta, error = paths(where, device)
    return (os.path.exists(tensors) and os.path.exists(meta)) or os.path.exists(error)


def _remove_at_exit(path: str) -> None:
    import atexit

    atexit.register(shutil.rmtree, path, True)


def _process_dir(kind: str) -> str:
    path = tempfile.mkdtemp(prefix=f"cnncompare-{kind}-")
    _remove_at_exit(path)
    return path


def reference_plan(backends: list[Any], config: RunConfig) -> ReferencePlan:
    """What the reference must cover for ``backends`` on one device (``ReferencePlan``)."""
    from ..cell.parity import parity_step

    judged = [parity_step(base.min_warmup(b)) for b in backends] or [parity_step(0)]
    steps = max(1 + max(config.warmup, n - 1) + config.steps for n in judged)
    precisions = tuple(sorted({base.precision(b) for b in backends} - {"fp32"}))
    shards = (config.nproc or 1) * config.nnodes if config.distributed else 1
    return ReferencePlan(tuple(sorted(set(judged))), steps, precisions, shards)


def ensure_reference(backends: list[Any], workload: Any, slot: DeviceSlot, config: RunConfig,
                     run_dir: str) -> Optional[ReferenceInfo]:
    """Make the parity reference for ``backends`` on ``slot`` available in ``run_dir``: from the
    cache on disk (``reference_cache``, unless ``config.reference_cache`` is off), from this
    process's earlier one, or computed in a child of its own (then cached). Returns how it was
    had, None when it failed (the failure is left in ``run_dir`` for the cells to report as the
    workload's: ``reference.Meta.load``) or no backend here can run."""
    from ..cell.reference import paths

    runnable = [b for b in backends if not (slot.unavailable or unavailable(b, slot.name, config))]
    if not runnable:
        return None
    plan = reference_plan(runnable, config)
    key = _reference_key(workload, slot, config, plan)
    if key in _REFERENCES and _still_there(_REFERENCES[key][0], slot.name):
        where, info = _REFERENCES[key]
        if info is not None and info.cache:
            os.utime(info.cache)  # a use, as a lookup records it: eviction takes the least recently used
        info = replace(info, reused=True) if info is not None else None
    else:
        where, info = _REFERENCES[key] = _obtain_reference(runnable[0], workload, slot, config, plan)
    for cached, linked in zip(paths(where, slot.name), paths(run_dir, slot.name)):
        if os.path.exists(cached) and not os.path.exists(linked):
            try:  # a hard link outlives the entry's eviction by a run beside this one
                os.link(cached, linked)
            except OSError:  # another file system
                os.symlink(cached, linked)
    return info


def paid(info: Optional[ReferenceInfo]) -> Optional[float]:
    """What a run paid for its reference: nothing where it was reused."""
    return None if info is None else 0.0 if info.reused else info.seconds


def _obtain_reference(backend: Any, workload: Any, slot: DeviceSlot, config: RunConfig,
                      plan: ReferencePlan) -> tuple[str, Optional[ReferenceInfo]]:
    """The reference's directory, from the cache or computed (into the cache where it is on), and
    how it was had (None: it failed, its error is in the directory). A cache that can't be read
    or written costs the run nothing but the reuse: the reference is computed for this run
    alone, and the report says why."""
    from . import reference_cache

    if not config.reference_cache:
        where = _compute_reference(backend, workload, slot, config, plan, _process_dir("reference"))
        return where, _info(where, slot.name, reused=False)
    try:
        name, described = reference_cache.key(workload, slot.name, config, plan)
        entry = reference_cache.lookup(name, slot.name)
        if entry is not None:
            return str(entry), _info(str(entry), slot.name, reused=True, cache=str(entry))
        staged = str(reference_cache.staging())
    except OSError as exc:
        where = _compute_reference(backend, workload, slot, config, plan, _process_dir("reference"))
        return where, _info(where, slot.name, reused=False, note=f"the cache at {reference_cache.root()} can't be "
                            f"used ({type(exc).__name__}: {exc}): computed for this run only")
    _compute_reference(backend, workload, slot, config, plan, staged)
    info = _info(staged, slot.name, reused=False)
    if info is None:  # failed: nothing to keep; its error stays for this run's cells
        _remove_at_exit(staged)
        return staged, None
    try:
        entry = reference_cache.publish(Path(staged), name, described)
    except OSError as exc:  # a full disk: this run keeps its copy, the next computes again
        _remove_at_exit(staged)
        return staged, replace(info, note=f"it couldn't be cached ({type(exc).__name__}: {exc})")
    return str(entry), replace(info, cache=str(entry))


def _info(where: str, device: str, reused: bool, cache: Optional[str] = None,
          note: Optional[str] = None) -> Optional[ReferenceInfo]:
    """How the reference in ``where`` was had; None where it failed (its error is there)."""
    from ..cell.reference import Meta

    try:
        meta = Meta.load(where, device)
    except Exception:
        return None
    return ReferenceInfo(seconds=meta.seconds, reused=reused, cache=cache, computed_at=meta.computed_at, note=note)


def _compute_reference(backend: Any, workload: Any, slot: DeviceSlot, config: RunConfig,
                       plan: ReferencePlan, where: str) -> str:
    """Compute a reference into the directory ``where``; the directory."""
    from ..cell.reference import paths

    alone = config.single_process() if config.distributed else config
    workdir = os.path.join(where, "child")
    outcome = spawn(backend, workload, slot.name, alone, workdir, os.path.join(workdir, "cache"), where,
                    lambda name, done, total: None, reference=plan)
    error = paths(where, slot.name)[2]
    if not outcome.succeeded and not os.path.exists(error):  # crashed or timed out before it could say why
        from ..fileio import write_atomic

        why = (outcome.record.error if outcome.record and outcome.record.error else
               f"the parity reference's process ended with code {outcome.returncode}"
               + (f" ({outcome.killed_for.value})" if outcome.killed_for else ""))
        write_atomic(error, f"{why}; log: {outcome.log_tail or ''}".strip())
    shutil.rmtree(workdir, ignore_errors=True)
    return where


def row_fields(backend: Any, plugin: Optional[str], slot: DeviceSlot, config: RunConfig) -> dict[str, Any]:
    """What the parent knows of a row before its child says anything."""
    return dict(backend=backend.name, device=slot.name, plugin=plugin, description=base.description(backend),
                use_it=base.use_it(backend, slot.name, plugin, config.workload.recipe.optimizer_at(config.lr)),
                compile_cache=config.compile_cache)


def unavailable(backend: Any, device: str, config: RunConfig) -> Optional[str]:
    """Why ``backend`` can't run on ``device`` under ``config`` (its modes, the device, torchrun),
    or None: such a cell is a ``skipped`` row."""
    import torch

    reason = base.mode_reason(backend, config.mode) or base.unavailable_reason(backend, torch.device(device))
    if reason is None and config.distributed:
        assert config.nproc is not None
        reason = torchrun.unavailable(device, config.nproc)
    return reason


def _saves_portable_caches() -> bool:
    """Whether this torch can save a compile cache another process loads (torch 2.7 and newer)."""
    import torch

    return hasattr(torch.compiler, "save_cache_artifacts")


def _measure(backend: Any, workload: Any, device: str, config: RunConfig, cell_dir: str, run_dir: Optional[str],
             on_phase: PhaseCallback, cache: str, judge: bool = True,
             pairing: Optional[Pairing] = None) -> tuple[Outcome, Optional[Outcome], Optional[Outcome]]:
    """The cell's measuring child(ren) in ``cell_dir`` with the compile cache ``cache``: one run,
    or with ``--compile-cache warm`` a cold run (which saves its portable cache,
    ``torch.compiler.save_cache_artifacts``), a warm one sharing its cache, and one from an empty
    cache loaded with the portable one (``load_cache_artifacts``; time and memory only). Returns
    the outcome to report and, in warm mode, the cold and the portable ones (their compile times
    go beside it; the portable None where the cold run saved nothing). With ``pairing`` the
    reported child serves its steps, driven by ``pairing.drive``."""

    def child(name: str, serve: bool, cache: str = cache, judge: bool = judge,
              artifacts: Optional[CacheArtifacts] = None) -> Outcome:
        started = Child(backend, workload, device, config, os.path.join(cell_dir, name), cache, run_dir, on_phase,
                        judge, serve=serve, artifacts=artifacts)
        try:
            if serve and (peer := started.wait_ready()) is not None:
                assert pairing is not None
                pairing.drive(peer, started.killed)
            return started.finish()
        finally:
            started.close()

    if config.compile_cache != "warm":
        return child("run", pairing is not None), None, None
    portable = os.path.join(cell_dir, "portable-cache.bin")
    cold = child("cold", False, artifacts=CacheArtifacts(portable))
    if not cold.succeeded:
        return cold, None, None
    warm = child("warm", pairing is not None)
    if not os.path.exists(portable):  # nothing was compiled, or this torch can't save a portable cache
        return warm, cold, None
    # From an empty cache loaded with the cold run's artifacts, as another machine would start.
    return warm, cold, child("portable", False, os.path.join(cell_dir, "portable-compile-cache"), False,
                             CacheArtifacts(portable, load=True))


def result_of(outcome: Outcome, config: RunConfig, row: dict) -> CellResult:
    """The report's row from the child's record (maybe partial) and how the child ended."""
    record = outcome.record or CellRecord()
    result = CellResult.from_record(record, **row)
    finished = outcome.record is not None and outcome.record.complete
    if outcome.killed_for is Status.TIMEOUT:
        result.status = Status.TIMEOUT
        where = "in the parity check, after timing" if outcome.record else "before any figure was taken"
        result.error = f"timed out after {config.timeout_s:g} s ({where}); the child's process tree was killed"
        result.error_tail = outcome.log_tail
    elif outcome.killed_for is Status.OOM:
        result.status = Status.OOM
        result.error = f"the cell's processes exceeded --max-memory {config.max_memory_mb} MB RSS and were killed"
        result.error_tail = outcome.log_tail
    elif outcome.returncode != 0 or not finished:
        result.status = Status.CRASHED
        code = outcome.returncode
        if code < 0:
            name = signal.Signals(-code).name
            hint = " (the kernel's OOM killer sends SIGKILL)" if -code == signal.SIGKILL else ""
            result.error = f"the child was killed by {name}{hint}"
        elif config.distributed:  # torchrun's own summary (which rank, which signal) is in the log tail
            result.error = f"torchrun exited with code {code} without a result: a rank died"
        else:
            result.error = f"the child exited with code {code} without a result"
        if outcome.record:
            result.error += " during the parity check, after timing"
        result.error_tail = outcome.log_tail
    return result
