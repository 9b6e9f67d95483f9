"""Parameter server: the pure `ParameterStore`, its optimizer settings and the asyncio `PSServer`."""

from __future__ import annotations

from .optim import OptimizerSettings
from .server import PSServer, ServerSettings
from .store import ParameterStore, StepApplied

__all__ = ["OptimizerSettings", "PSServer", "ParameterStore", "ServerSettings", "StepApplied"]
