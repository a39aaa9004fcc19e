"""What ``--devices`` means on this machine.

``all`` is the CPU plus every CUDA device (and MPS where present). A known
kind that is absent (``cuda`` on a CPU box) yields a device with a reason,
reported as ``skipped`` rows; an unknown kind (``tpu``) is a usage error.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

KNOWN_KINDS = ("cpu", "cuda", "mps")


class DeviceError(ValueError):
    """A ``--devices`` value that can't be used; ``unknown`` is the kind it doesn't know, if that is why."""

    def __init__(self, message: str, unknown: Optional[str] = None):
        super().__init__(message)
        self.unknown = unknown


@dataclass(frozen=True)
class DeviceSlot:
    """A device to run on, or the reason it can't be (then every cell on it is skipped)."""

    name: str
    unavailable: Optional[str] = None


def cuda_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _mps_available() -> bool:
    import torch

    mps = getattr(torch.backends, "mps", None)
    return bool(mps and mps.is_available())


def present_devices() -> list[str]:
    devices = ["cpu"] + [f"cuda:{i}" for i in range(cuda_count())]
    if _mps_available():
        devices.append("mps")
    return devices


def parse_devices(spec: str) -> list[str]:
    """Split and check a ``--devices`` value without touching torch (usage errors first)."""
    parts = [p.strip() for p in spec.split(",") if p.strip()]
    if not parts:
        raise DeviceError("no device given")
    for part in parts:
        if part == "all":
            continue
        kind, _, index = part.partition(":")
        if kind not in KNOWN_KINDS:
            raise DeviceError(f"unknown device {part!r}; known: all, {', '.join(KNOWN_KINDS)} (e.g. cuda:0)", kind)
        if index and (kind == "cpu" or not index.isdigit()):
            raise DeviceError(f"bad device index in {part!r}")
    return parts


def resolve_devices(parts: list[str]) -> list[DeviceSlot]:
    """Expand ``all`` and bare kinds into the devices present; keep absent ones with a reason."""
    present = present_devices()
    slots: list[DeviceSlot] = []

    def add(slot: DeviceSlot) -> None:
        if slot.name not in {s.name for s in slots}:
            slots.append(slot)

    for part in parts:
        if part == "all":
            for name in present:
                add(DeviceSlot(name))
        elif part == "cpu":
            add(DeviceSlot("cpu"))
        elif part in ("cuda", "mps"):
            matching = [d for d in present if d.split(":")[0] == part]
            if not matching:
                add(DeviceSlot(part, f"no {part.upper()} device on this machine"))
            for name in matching:
                add(DeviceSlot(name))
        else:  # cuda:N
            add(DeviceSlot(part) if part in present else DeviceSlot(part, f"{part} is not present on this machine"))
    return slots
