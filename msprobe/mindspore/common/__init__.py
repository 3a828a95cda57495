"""Compatibility path of the seed: ``msprobe.mindspore.common.utils``."""
