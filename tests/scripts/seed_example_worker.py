"""Worker for tests/test_seed_examples.py: runs one code example of the seed document
(mindspore_data_dump_instruct.md) as written there, on CPU, in the current directory (which holds
the example's ``./config.json``; ``dump_path`` is ``./dump_path``).

    python seed_example_worker.py EXAMPLE

Changes to the seed's text, so that it runs: ``device_target="Ascend"`` becomes
``ms.set_device("CPU")``; ``Network``, ``data_loader``, ``loss_fn``, ``optimizer`` and
``train_dataset`` (the seed's ``# ...``) are defined below; ``loss.backward()`` (no such method in
MindSpore) becomes the ``mindspore.value_and_grad`` call that runs the backward of the code block;
the vLLM model of the token_range example is examples.models.TinyLM with greedy generation.
Launch is MindSpore's default (asynchronous). Prints ``DONE`` at the end.
"""
from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

STEPS = 2
BATCH = 4


def batches():
    """``(inputs, labels)``: the examples' data, ``STEPS`` numpy batches."""
    rng = np.random.RandomState(0)
    xs = [rng.randn(BATCH, 4).astype(np.float32) for _ in range(STEPS)]
    ys = [rng.randint(0, 3, BATCH).astype(np.int32) for _ in range(STEPS)]
    return xs, ys


def _definitions(ms):
    """The seed's ``# 模型、损失函数的定义以及初始化等操作``: a small network with Cells (L0), a
    functional API (L1) and Primitives inside ``nn.Dense`` (L1 with the model)."""
    from mindspore import Tensor, nn, ops
    from mindspore import dataset as ds

    ms.set_seed(0)  # the same parameters in every example's process

    class Network(nn.Cell):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Dense(4, 8)
            self.relu = nn.ReLU()
            self.fc2 = nn.Dense(8, 3)

        def construct(self, x):
            h = self.relu(self.fc1(x))
            h = ops.tanh(h)
            return self.fc2(h)

    xs, ys = batches()
    data_loader = [(Tensor(x), Tensor(y)) for x, y in zip(xs, ys)]
    train_dataset = ds.NumpySlicesDataset({"data": xs, "label": ys}, shuffle=False)
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    return Network, data_loader, train_dataset, loss_fn


def graph_l0_loop():
    """静态图场景 / 使用示例（L0级别） / 未使用Model高阶API."""
    import mindspore as ms
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")

    from msprobe.mindspore import PrecisionDebugger
    debugger = PrecisionDebugger(config_path="./config.json")

    Network, data_loader, _, _ = _definitions(ms)
    model = Network()
    for data, label in data_loader:
        debugger.start(model)  # 进行L0级别下Cell对象的数据采集时调用
        grad_net = ms.grad(model)(data)
        debugger.step()         # 更新迭代数


def graph_l0_model():
    """静态图场景 / 使用示例（L0级别） / 使用Model高阶API."""
    import mindspore as ms
    from mindspore import nn
    from mindspore.train import Model
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")

    from msprobe.mindspore import PrecisionDebugger
    from msprobe.mindspore.common.utils import MsprobeStep
    debugger = PrecisionDebugger(config_path="./config.json")

    Network, _, train_dataset, loss_fn = _definitions(ms)
    model = Network()
    optimizer = nn.Momentum(model.trainable_params(), learning_rate=0.01, momentum=0.9)
    debugger.start(model)
    trainer = Model(model, loss_fn=loss_fn, optimizer=optimizer, metrics={'accuracy'})
    trainer.train(1, train_dataset, callbacks=[MsprobeStep(debugger)])


def graph_l2():
    """静态图场景 / 使用示例（L2级别）."""
    import mindspore as ms
    from mindspore import nn
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")

    from msprobe.mindspore import PrecisionDebugger
    debugger = PrecisionDebugger(config_path="./config.json")
    debugger.start()
    # 模型定义和训练代码
    Network, data_loader, _, loss_fn = _definitions(ms)
    model = Network()
    optimizer = nn.SGD(model.trainable_params(), learning_rate=0.01)
    train_step = nn.TrainOneStepCell(nn.WithLossCell(model, loss_fn), optimizer)
    for data, label in data_loader:
        train_step(data, label)
    debugger.stop()
    debugger.step()


def _pynative_loop(start_with_model: bool):
    """动态图场景 / 使用示例（L0、L1、mix级别） / 未使用Model高阶API."""
    import mindspore as ms
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_device("CPU")

    from msprobe.mindspore import PrecisionDebugger
    debugger = PrecisionDebugger(config_path="./config.json")

    Network, data_loader, _, _ = _definitions(ms)
    model = Network()
    for data, label in data_loader:
        if start_with_model:
            debugger.start(model)  # 进行L0, mix级别或L1级别下primitive op的数据采集时调用
        else:
            debugger.start()        # 进行L1级别下非primitive op采集时调用
        grad_net = ms.grad(model)(data)
        debugger.stop()         # 关闭数据dump
        debugger.step()         # 更新迭代数


def pynative_loop():
    _pynative_loop(False)


def pynative_loop_model():
    _pynative_loop(True)


def _pynative_model_train(start_with_model: bool):
    """动态图场景 / 使用示例（L0、L1、mix级别） / 使用Model高阶API."""
    import mindspore as ms
    from mindspore import nn
    from mindspore.train import Model
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_device("CPU")

    from msprobe.mindspore import PrecisionDebugger
    from msprobe.mindspore.common.utils import MsprobeStep
    debugger = PrecisionDebugger(config_path="./config.json")

    Network, _, train_dataset, loss_fn = _definitions(ms)
    model = Network()
    optimizer = nn.Momentum(model.trainable_params(), learning_rate=0.01, momentum=0.9)
    # 只有进行L0级别下Cell对象，mix级别，L1级别下primitive op的数据采集时才需要调用
    if start_with_model:
        debugger.start(model)
    trainer = Model(model, loss_fn=loss_fn, optimizer=optimizer, metrics={'accuracy'})
    trainer.train(1, train_dataset, callbacks=[MsprobeStep(debugger)])


def pynative_model():
    _pynative_model_train(False)


def pynative_model_with_model():
    _pynative_model_train(True)


def pynative_code_block():
    """动态图场景 / 采集指定代码块的前反向数据: start → forward → stop → backward → step."""
    import mindspore as ms
    from mindspore import set_device
    ms.set_context(mode=ms.PYNATIVE_MODE)

    set_device("CPU", 0)

    from msprobe.mindspore import PrecisionDebugger
    debugger = PrecisionDebugger(config_path="./config.json")

    Network, data_loader, _, loss_fn = _definitions(ms)
    model = Network()

    def forward_and_loss(data, label):
        debugger.start()  # 开启数据dump
        output = model(data)
        debugger.stop()  # 只dump start函数到该函数之间的前反向数据
        return loss_fn(output, label)

    # loss.backward(): MindSpore runs the backward of the code block with value_and_grad
    backward = ms.value_and_grad(forward_and_loss, None, model.trainable_params())
    for data, label in data_loader:
        loss, grads = backward(data, label)
        debugger.step()  # 结束一个step的dump


def pynative_l2_loop():
    """动态图场景 / 使用示例（L2级别） / 未使用Model高阶API (jit-compiled parts are dumped)."""
    import mindspore as ms
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_device("CPU")

    from msprobe.mindspore import PrecisionDebugger
    debugger = PrecisionDebugger(config_path="./config.json")
    debugger.start()
    # 请勿将以上初始化流程置于模型实例化或mindspore.communication.init调用后

    Network, data_loader, _, _ = _definitions(ms)
    model = Network()

    @ms.jit  # the seed: only mindspore.jit parts run as graphs, whose kernels L2 dumps
    def forward(data):
        return model(data)

    for data, label in data_loader:
        grad_net = ms.grad(forward)(data)


def pynative_l2_model():
    """动态图场景 / 使用示例（L2级别） / 使用Model高阶API (the optimizer's construct is jit)."""
    import mindspore as ms
    from mindspore import nn
    from mindspore.train import Model
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_device("CPU")

    from msprobe.mindspore import PrecisionDebugger
    debugger = PrecisionDebugger(config_path="./config.json")
    debugger.start()

    Network, _, train_dataset, loss_fn = _definitions(ms)
    model = Network()
    optimizer = nn.Momentum(model.trainable_params(), learning_rate=0.01, momentum=0.9)
    trainer = Model(model, loss_fn=loss_fn, optimizer=optimizer, metrics={'accuracy'})
    trainer.train(1, train_dataset)


def token_range():
    """推理模型采集指定token_range (examples.models.TinyLM instead of a vLLM model)."""
    from msprobe.mindspore import PrecisionDebugger, seed_all
    # 在模型训练开始前固定随机性
    seed_all()
    import mindspore as ms
    ms.set_device("CPU")
    # 请勿将PrecisionDebugger的初始化流程插入到循环代码中
    debugger = PrecisionDebugger(config_path="./config.json", dump_path="./dump_path")
    from examples.models import TinyLM, generate
    model = TinyLM(vocab_size=12, d_model=16, n_heads=2, n_layers=1, seq_len=16)
    prompts = [1, 2, 3]
    # 开启数据dump, 指定采集推理模型逐字符循环推理中的第1~3次
    debugger.start(model=model, token_range=[1, 3])
    # 推理模型生成的逻辑
    output = generate(model, prompts, 6)
    # 关闭数据dump并落盘
    debugger.stop()
    debugger.step()


def debug_save():
    """接口介绍 / save: ``save(variable, name, save_backward=True)`` inside the step."""
    import mindspore as ms
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_device("CPU")
    from msprobe.mindspore import PrecisionDebugger
    debugger = PrecisionDebugger(config_path="./config.json")
    Network, data_loader, _, loss_fn = _definitions(ms)
    model = Network()

    def forward_fn(data, label):
        logits = model(data)
        debugger.save(logits, "logits", save_backward=True)
        loss = loss_fn(logits, label)
        debugger.save({"loss": loss, "batch": data.shape[0]}, "loss_info", save_backward=False)
        return loss

    grad_fn = ms.value_and_grad(forward_fn, None, model.trainable_params())
    for data, label in data_loader:
        grad_fn(data, label)
        debugger.step()


def interfaces():
    """接口介绍: set_init_step, register_custom_api / restore_custom_api (mindspore.ops.matmul),
    start(rank_id=...)."""
    import mindspore as ms
    from mindspore import Tensor, ops
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_device("CPU")
    from msprobe.mindspore import PrecisionDebugger
    debugger = PrecisionDebugger(config_path="./config.json")
    debugger.set_init_step(5)
    debugger.register_custom_api(ops, "matmul", "MyOps")
    w = Tensor(np.ones((4, 2), np.float32))
    x = Tensor(np.arange(8, dtype=np.float32).reshape(2, 4))
    for step in range(STEPS):
        if step == 1:
            debugger.restore_custom_api(ops, "matmul")
        debugger.start(rank_id=3)
        ms.grad(lambda a: ops.matmul(a, w).sum())(x)
        debugger.stop()
        debugger.step()


EXAMPLES = {name: fn for name, fn in globals().items()
            if callable(fn) and not name.startswith("_") and fn.__module__ == __name__
            and name not in ("main", "batches")}


def main():
    EXAMPLES[sys.argv[1]]()
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
