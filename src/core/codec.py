"""JSON for the typed records: strict reading into dataclasses, and no NaN written."""
from __future__ import annotations

import math
from enum import Enum
from typing import Any, TypeVar

import dacite

T = TypeVar("T")

#: JSON has one number type: an int where a float is expected is that float.
_DACITE = dacite.Config(cast=[Enum], type_hooks={float: float}, strict=True)


def from_data(cls: type[T], data: dict[str, Any]) -> T:
    """A record from its JSON object; raises ``ValueError`` naming the offending field."""
    try:
        return dacite.from_dict(cls, data, config=_DACITE)
    except (dacite.DaciteError, ValueError, TypeError) as exc:  # ValueError: an unknown enum value
        raise ValueError(f"{cls.__name__}: {exc}") from None


def finite(value: Any) -> Any:
    """NaN and infinity are not JSON: a figure that is not a number is null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite(v) for v in value]
    return value
