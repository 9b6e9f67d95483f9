"""JSON that every parser reads: summaries and event logs with null, never NaN, for an undefined figure.

Python's json writes NaN and Infinity by default, which is not JSON (a diverged loss, or the mean
of zero steps, would make a summary that jq and most languages refuse). Shared by the launcher and
the `launch` and `worker` commands.
"""

from __future__ import annotations

import json
import math
from typing import Any


def finite_or_null(value: Any) -> Any:
    """`value` with every NaN or infinity (a diverged loss, a figure of zero steps) made None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite_or_null(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_null(v) for v in value]
    return value


def strict_json(value: Any, **kwargs: Any) -> str:
    """JSON that every parser reads: undefined figures are null, never the non-standard NaN."""
    return json.dumps(finite_or_null(value), allow_nan=False, **kwargs)
