"""Worker side: the PS client, the PyTorch-native optimizer wrapper, and the training loop."""

from __future__ import annotations

from .client import Identity, PSClient
from .connect import ConnectSettings
from .optimizer import NetSenseOptimizer, StepStats
from .task import TrainTask
from .trainer import TrainSettings, train

__all__ = ["ConnectSettings", "Identity", "NetSenseOptimizer", "PSClient", "StepStats", "TrainSettings", "TrainTask", "train"]
