"""Integer inputs never set the tolerance of floating-point records: an ``nn.Embedding`` looked up with
token ids in the hundreds, in a Float16 run against a Float32 run whose tables differ (other seeds),
real MindSpore dumps at mix (CPU, PyNative, one forward)."""
from __future__ import annotations

import os
from collections import defaultdict

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn

from msprobe.compare import compare, first_divergence


class EmbeddingNet(nn.Cell):
    """Embedding(1000, 16) -> Dense(16, 1) -> mean."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(1000, 16)
        self.fc = nn.Dense(16, 1)

    def construct(self, tokens):
        return self.fc(self.emb(tokens)).mean()


def _dump(root, name: str, seed: int, half: bool) -> str:
    from msprobe.mindspore import PrecisionDebugger

    ms.set_seed(seed)
    net = EmbeddingNet()
    if half:
        net.to_float(ms.float16)
    path = os.path.join(str(root), name)
    debugger = PrecisionDebugger(dump_path=path, level="mix", step=[0])
    tokens = Tensor(np.arange(900, 964, dtype=np.int32).reshape(8, 8))  # Norm ~7.45e3
    debugger.start(net)
    net(tokens)
    debugger.stop()
    debugger.step()
    return path


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    root = tmp_path_factory.mktemp("emb")
    return {"fp16": _dump(root, "fp16", 1, True), "fp32": _dump(root, "fp32", 2, False)}


def test_embedding_table_differs_against_its_integer_ids(dumps):
    rows = {r["NPU Name"]: r for r in compare(dumps["fp16"], dumps["fp32"])}
    ids = rows["Primitive.gather.Gather.0.forward.input.1"]
    assert ids["NPU Dtype"] == "Int32" and ids["Bench l2norm"] > 7000
    for table in ("Primitive.gather.Gather.0.forward.input.0",
                  "Cell.emb.Embedding.forward.0.parameters.embedding_table"):
        assert rows[table]["Result"] == "error", rows[table]
        assert "near zero" not in rows[table]["Err_message"], rows[table]
    assert rows["Primitive.gather.Gather.0.forward.output.0"]["Result"] == "error"
    assert rows["Cell.emb.Embedding.forward.0.output.0"]["Result"] == "error"


def test_one_tensor_one_verdict(dumps):
    """Records holding the same tensor on both sides (the Gather output that the next Reshape takes,
    the table as the Cell's parameter and as Gather's input) are given the same result."""
    verdicts = defaultdict(set)
    for row in compare(dumps["fp16"], dumps["fp32"]):
        if row["NPU Dtype"] and row["NPU Dtype"].startswith("Float"):
            key = tuple(row[c] for c in ("NPU Dtype", "Bench Dtype", "NPU max", "NPU min", "NPU mean",
                                         "NPU l2norm", "Bench max", "Bench min", "Bench mean", "Bench l2norm"))
            verdicts[key].add((row["Result"], row["NPU Name"]))
    shared = {k: v for k, v in verdicts.items() if len(v) > 1}
    assert shared  # the network passes tensors from call to call
    for records in shared.values():
        assert len({result for result, _ in records}) == 1, sorted(records)


def test_first_diff_names_the_lookup_of_the_differing_table(dumps):
    (found,) = first_divergence(dumps["fp16"], dumps["fp32"])
    assert found.kind == "input"
    assert found.entry in ("Primitive.gather.Gather.0.forward", "Cell.emb.Embedding.forward.0")
    assert "its parameters already differ" in found.reason()
    assert "embedding_table" in found.reason()
