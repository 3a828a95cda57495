"""The vectorised statistics judgement (msprobe/compare/batch.py) gives exactly what the per-record
rules (msprobe/compare/judge.py) give, on real dumps with errors, fp16 and NaN."""
from __future__ import annotations

import math

import mindspore as ms

from compare_dumps import make_dump
from msprobe.compare import comparisons
from msprobe.compare import judge as J


def _same(a, b):
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def test_batch_equals_per_record_rules(tmp_path):
    base = make_dump(tmp_path, "base")
    checked = 0
    for other in (make_dump(tmp_path, "seed1", seed=1), make_dump(tmp_path, "fp16", dtype=ms.float16),
                  make_dump(tmp_path, "nan", nan=True)):
        (c,) = comparisons(other, base)
        for entry in c.entries():
            for j in entry.records:
                if j.target is None or j.golden is None or not j.target.is_tensor:
                    continue
                ref = J.judge(j.target, j.golden, "statistics", c.thresholds)
                assert (j.result, j.exact, j.messages) == (ref.result, ref.exact, ref.messages)
                assert _same(j.error, ref.error)
                assert all(_same(j.metrics[k], ref.metrics[k]) for k in ref.metrics), (j.metrics, ref.metrics)
                checked += 1
    assert checked > 150
