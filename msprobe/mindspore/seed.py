"""``seed_all`` (seed: "seed_all"): fix randomness and optionally switch on deterministic computing."""
from __future__ import annotations

import os
import random

import numpy as np

from msprobe.engine.config import ConfigError


def seed_all(seed: int = 1234, mode: bool = False, rm_dropout: bool = False) -> None:
    """Seed Python, NumPy and MindSpore; optionally deterministic kernels and no dropout.

    Args:
        seed (int): in [0, 4294967295].
        mode (bool): True switches on deterministic computation (``deterministic="ON"``) and
            ``HCCL_DETERMINISTIC``.
        rm_dropout (bool): True makes ``ops.Dropout``/``Dropout2D``/``Dropout3D``,
            ``mint.nn.Dropout`` and ``mint.nn.functional.dropout`` identities. Must be called before
            the Dropout instances are created.

    Raises:
        ConfigError: an argument of the wrong type or out of range.
    """
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= 4294967295:
        raise ConfigError("seed", seed, "an integer in [0, 4294967295]", kind="argument")
    for name, value in (("mode", mode), ("rm_dropout", rm_dropout)):
        if not isinstance(value, bool):
            raise ConfigError(name, value, "True or False", kind="argument")
    import mindspore as ms

    os.environ["PYTHONHASHSEED"] = str(seed)
    random.seed(seed)
    np.random.seed(seed)
    ms.set_seed(seed)
    wanted = "ON" if mode else "OFF"
    # only when it changes: MindSpore warns that set_context(deterministic=) is deprecated, and its
    # replacement set_deterministic() refuses to be called twice in a process
    if ms.get_context("deterministic") != wanted:
        ms.set_context(deterministic=wanted)
    os.environ["HCCL_DETERMINISTIC"] = str(mode)
    if rm_dropout:
        _remove_dropout()


def _remove_dropout() -> None:
    from mindspore import mint, ops

    def keep_all(cls, **fixed):
        class NoDropout(cls):
            def __init__(self, *args, **kwargs):
                kwargs.update(fixed)
                super().__init__(*args[:0], **kwargs)
        NoDropout.__name__ = cls.__name__
        return NoDropout

    ops.Dropout = keep_all(ops.Dropout, keep_prob=1.0)
    ops.operations.Dropout = ops.Dropout
    ops.Dropout2D = keep_all(ops.Dropout2D, keep_prob=1.0)
    ops.Dropout3D = keep_all(ops.Dropout3D, keep_prob=1.0)
    mint.nn.Dropout = keep_all(mint.nn.Dropout, p=0.0)
    mint.nn.functional.dropout = lambda input, p=0.5, training=True, inplace=False: input
