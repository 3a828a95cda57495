"""MindSpore precision data dump: the seed's public names.

``from msprobe.mindspore import PrecisionDebugger, seed_all, MsprobeStep, MsprobeInitStep``
"""
from msprobe.mindspore.callbacks import MsprobeInitStep, MsprobeStep
from msprobe.mindspore.debugger import PrecisionDebugger
from msprobe.mindspore.seed import seed_all

__all__ = ["PrecisionDebugger", "seed_all", "MsprobeStep", "MsprobeInitStep"]
