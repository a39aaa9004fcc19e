"""Words the markdown report and the charts share, so a step is called the same in both."""
from __future__ import annotations

from typing import Any

#: One step, per mode, in a word: the summary's break-even and the charts' axes count these.
STEP_UNIT = {"train": "training step", "inference": "forward"}


def plural(noun: str, count: Any) -> str:
    """``noun`` for a count of 1 (or "1"), else with an s."""
    return noun if str(count) == "1" else f"{noun}s"
