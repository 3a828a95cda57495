"""Compatibility module: the seed imports ``MsprobeStep`` from ``msprobe.mindspore.common.utils``."""
from msprobe.mindspore.callbacks import MsprobeInitStep, MsprobeStep
from msprobe.mindspore.seed import seed_all

__all__ = ["MsprobeStep", "MsprobeInitStep", "seed_all"]
