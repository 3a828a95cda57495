"""seed_all (seed: "seed_all"): validation, reproducible initialisation, deterministic flag, rm_dropout."""
import os
import random

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn, ops

from msprobe.engine.config import ConfigError
from msprobe.mindspore import seed_all


@pytest.mark.parametrize("kwargs, field", [
    ({"seed": -1}, "seed"), ({"seed": 2 ** 32}, "seed"), ({"seed": "1"}, "seed"), ({"seed": True}, "seed"),
    ({"mode": 1}, "mode"), ({"rm_dropout": "yes"}, "rm_dropout"),
])
def test_bad_arguments_name_the_argument(kwargs, field):
    with pytest.raises(ConfigError) as err:
        seed_all(**kwargs)
    assert f"'{field}'" in str(err.value)


def test_same_seed_same_parameters_and_random_streams():
    seed_all(1234)
    a = nn.Dense(8, 4).weight.asnumpy().copy()
    r1, n1 = random.random(), np.random.rand()
    seed_all(1234)
    b = nn.Dense(8, 4).weight.asnumpy().copy()
    r2, n2 = random.random(), np.random.rand()
    assert np.array_equal(a, b) and r1 == r2 and n1 == n2
    assert os.environ["PYTHONHASHSEED"] == "1234"
    assert os.environ["HCCL_DETERMINISTIC"] == "False"


def test_mode_switches_deterministic_on():
    seed_all(7, mode=True)
    assert ms.get_context("deterministic") == "ON"
    assert os.environ["HCCL_DETERMINISTIC"] == "True"
    seed_all(7, mode=False)
    assert ms.get_context("deterministic") == "OFF"


def test_rm_dropout_makes_dropout_identity():
    saved = (ops.Dropout, ops.operations.Dropout, ops.Dropout2D, ops.Dropout3D, ms.mint.nn.Dropout,
             ms.mint.nn.functional.dropout)
    try:
        seed_all(3, rm_dropout=True)
        x = Tensor(np.ones((4, 16), np.float32))
        out, _ = ops.Dropout(keep_prob=0.5)(x)
        assert np.array_equal(out.asnumpy(), x.asnumpy())
        assert ms.mint.nn.functional.dropout(x, p=0.9) is x
    finally:
        (ops.Dropout, ops.operations.Dropout, ops.Dropout2D, ops.Dropout3D, ms.mint.nn.Dropout,
         ms.mint.nn.functional.dropout) = saved
