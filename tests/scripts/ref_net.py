"""The net of tests/scripts/reference_dump.py, shared with tests/test_compare_reference.py so the
reference tool's dump and msprobe's dump come from the same code."""
import mindspore as ms
import numpy as np
from mindspore import Tensor, mint, nn, ops


class Scale(nn.Cell):
    def __init__(self, factor):
        super().__init__()
        self.factor = factor

    def construct(self, h):
        return mint.mul(h, self.factor) * 0.5


class Net(nn.Cell):
    def __init__(self, factor):
        super().__init__()
        self.fc1 = nn.Dense(8, 16)
        self.relu = nn.ReLU()
        self.scale = Scale(factor)
        self.fc2 = nn.Dense(16, 4)

    def construct(self, x):
        h = ops.relu(self.relu(self.fc1(x)))
        return self.fc2(self.scale(h))


def dumped_step(debugger, factor: float) -> None:
    """Seed 0, build :class:`Net`, run one forward and backward between start(net) and stop/step."""
    ms.set_seed(0)
    np.random.seed(0)
    net = Net(factor)
    rng = np.random.RandomState(7)
    x = Tensor(rng.randn(4, 8).astype(np.float32))
    y = Tensor(rng.rand(4, 4).astype(np.float32))
    grad_fn = ms.value_and_grad(lambda a, b: ops.mse_loss(net(a), b), None, net.trainable_params())
    debugger.start(net)
    grad_fn(x, y)
    debugger.stop()
    debugger.step()
