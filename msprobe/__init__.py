"""msprobe for MindSpore: precision data dump (statistics and tensors) of MindSpore networks.

Public entry points live in :mod:`msprobe.mindspore` (``PrecisionDebugger``, ``seed_all``,
``MsprobeStep``, ``MsprobeInitStep``) and :mod:`msprobe.dump` (reading dumps back).
"""

from msprobe._version import __version__

__all__ = ["__version__"]
