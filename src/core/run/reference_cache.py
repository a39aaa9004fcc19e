"""The parity reference's cache on disk: computed once for what it depends on, reused by every
later run that needs the same one.

The reference (``cell/reference.py``) is a run's largest fixed cost: float64 and fp32 eager
trained three times, a declared reduced precision three more (30 s of 2 CPU cores at the default
config; 159 s with bf16 included). Its inputs rarely change from one run to the next, so a run looks here first.

An entry is keyed (``key``) by everything the reference depends on:

- the code that computes it: the source of ``cell/reference.py``, ``cell/parity.py`` and
  ``cell/training.py`` (a change there recomputes, with no version to bump by hand);
- torch's release and its CUDA, and the device: its type and model (the CPU's name, the GPU's);
- the workload: its name, its options as resolved, and the source of the file that defines it
  (the user's ``file.py``, the module of ``module:factory`` or of a plugin's workload) or, for a
  ``torchvision:``/``timm:`` model, the library's version;
- the config a cell's steps depend on (batch, seed, lr, mode, steps, warm-up, threads, malloc,
  DDP's shards) and the plan (parity steps, steps run, reduced precisions).

A model defined in a file other than the one named (a factory importing it from a module of
its own) is keyed by that file only: edited, its reference is stale. Eager itself then fails
parity, so the staleness is loud, not silent, and ``--no-cache`` computes the reference afresh;
the report says on every run whether the reference was reused.

Where: ``$CNNCOMPARE_CACHE_DIR``, else ``$XDG_CACHE_HOME/cnncompare``, else
``~/.cache/cnncompare``; each entry a directory ``reference/<key>`` holding the reference's files
and ``key.json`` (what it was keyed by, readable). At most ``MAX_ENTRIES`` entries and
``MAX_BYTES`` in all (the default config's reference is about 1.6 GB): the least recently used go
first. An entry appears whole or not at all (computed into a staging directory, then renamed),
so runs side by side may share the cache.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import inspect
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

from ..config import RunConfig
from ..fileio import write_atomic
from ..records import ReferencePlan

#: Overrides where the cache lives (the tests point it at a directory of their own).
ENV_DIR = "CNNCOMPARE_CACHE_DIR"
MAX_ENTRIES = 16
MAX_BYTES = 20 * 2**30
#: Config fields that don't change the reference: what runs, where, how long, how it is supervised
#: and how the rows are paired.
NOT_KEYED = ("backends", "devices", "timeout_s", "max_memory_mb", "backend_options", "compile_cache",
             "compile_threads", "rounds", "target", "budget_s", "round_s", "node_rank", "rdzv_endpoint",
             "reference_cache", "fork_server")
_KEY_FILE = "key.json"


def root() -> Path:
    """The cache's directory (not created)."""
    if os.environ.get(ENV_DIR):
        return Path(os.environ[ENV_DIR])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "cnncompare"


def _digest(path: Optional[str]) -> Optional[str]:
    if not path or not os.path.isfile(path):
        return None
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _workload_source(workload: Any) -> dict[str, Optional[str]]:
    """What identifies the workload's code: its file's digest, or its library's version."""
    library = getattr(workload, "library", None)
    if library:
        try:
            return {"library": library, "version": importlib.metadata.version(library)}
        except importlib.metadata.PackageNotFoundError:
            return {"library": library, "version": None}
    path = getattr(workload, "path", None)
    module = getattr(workload, "module", None)
    if not path and module:
        spec = importlib.util.find_spec(module)
        path = spec.origin if spec else None
    if not path:
        try:
            path = inspect.getsourcefile(type(workload))
        except TypeError:
            path = None
    return {"file": os.path.basename(path) if path else None, "sha256": _digest(path)}


def _device_model(device: str) -> str:
    import torch

    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    from .environment import cpu_model

    return cpu_model()


def _code() -> str:
    """The digest of the code that computes and reads the reference."""
    cell = Path(__file__).resolve().parent.parent / "cell"
    h = hashlib.sha256()
    for name in ("reference.py", "parity.py", "training.py"):
        h.update((cell / name).read_bytes())
    return h.hexdigest()


def key(workload: Any, device: str, config: RunConfig, plan: ReferencePlan) -> tuple[str, dict[str, Any]]:
    """The entry's name (a digest) and what it was made from, readable."""
    import torch

    described = {
        "code": _code(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": device.split(":")[0],
        "device_model": _device_model(device),
        "workload": {"name": workload.name, **_workload_source(workload)},
        "config": {k: v for k, v in config.to_dict().items() if k not in NOT_KEYED},  # threads resolved
        "plan": {"parity_steps": list(plan.parity_steps), "steps": plan.steps, "precisions": list(plan.precisions),
                 "shards": plan.shards},
    }
    text = json.dumps(described, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32], described


def _entries() -> Path:
    return root() / "reference"


def lookup(name: str, device: str) -> Optional[Path]:
    """The entry's directory where it holds ``device``'s reference whole; its use is recorded (its
    mtime) for eviction. An entry missing a file (deleted by hand) is removed, to be made again."""
    from ..cell.reference import paths

    entry = _entries() / name
    if not entry.is_dir():
        return None
    if not all(os.path.isfile(p) for p in (entry / _KEY_FILE, *paths(str(entry), device)[:2])):
        shutil.rmtree(entry, ignore_errors=True)
        return None
    os.utime(entry)
    return entry


def staging() -> Path:
    """A fresh directory to compute an entry into, inside the cache (a rename publishes it)."""
    _entries().mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=".staging-", dir=_entries()))


def publish(staged: Path, name: str, described: dict[str, Any]) -> Path:
    """Make ``staged`` (a computed reference) the entry ``name``, then evict beyond the limits.
    Where another run published the same entry meanwhile, its copy stays and ``staged`` goes."""
    write_atomic(str(staged / _KEY_FILE), json.dumps({**described, "stored": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                                              time.gmtime())},
                                                     indent=1, sort_keys=True, default=str))
    entry = _entries() / name
    try:
        os.replace(staged, entry)
    except OSError:  # a complete entry is already there (a run beside this one)
        shutil.rmtree(staged, ignore_errors=True)
    evict(keep=entry)
    return entry


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.iterdir() if f.is_file())


def evict(keep: Optional[Path] = None) -> list[Path]:
    """Remove the least recently used entries beyond ``MAX_ENTRIES`` or ``MAX_BYTES`` (never
    ``keep``), and staging directories a killed run left over a day ago. Returns what went."""
    if not _entries().is_dir():
        return []
    gone = []
    for stale in _entries().glob(".staging-*"):
        if time.time() - stale.stat().st_mtime > 86400:
            shutil.rmtree(stale, ignore_errors=True)
            gone.append(stale)
    entries = sorted((p for p in _entries().iterdir() if p.is_dir() and not p.name.startswith(".")),
                     key=lambda p: p.stat().st_mtime, reverse=True)
    total = 0
    for i, entry in enumerate(entries):
        total += _size(entry)
        if entry != keep and (i >= MAX_ENTRIES or total > MAX_BYTES):
            shutil.rmtree(entry, ignore_errors=True)
            gone.append(entry)
    return gone
