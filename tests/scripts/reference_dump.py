"""Write dumps with the reference tool (``mindstudio-probe``), for tests/test_compare_reference.py.

Run with the Python of a virtualenv that has ``mindstudio-probe`` (never beside this package: both
install ``msprobe``), e.g.::

    python -m venv /tmp/refvenv && /tmp/refvenv/bin/pip install "mindstudio-probe==26.2.0" \\
        "numpy<2" "pandas<3" "ml_dtypes<0.5" "onnx<1.18" mindspore==2.10.0
    /tmp/refvenv/bin/python tests/scripts/reference_dump.py tests/data/reference base 2.0
    /tmp/refvenv/bin/python tests/scripts/reference_dump.py tests/data/reference factor 2.5

It runs the net of ``ref_net.py`` one forward and backward at level ``mix``, task ``statistics``, twice: ``base``
and ``factor`` (the ``mint.mul`` factor inside the ``Scale`` Cell is 2.5 instead of 2.0). On CPU the
reference computes Norm with ``mindspore.mint.norm``, which has no CPU kernel in MindSpore 2.10, so
``mint.norm`` is pointed at ``ops.norm`` first.
"""
import json
import os
import shutil
import sys

import mindspore as ms
from mindspore import mint, ops

ms.set_device("CPU")
ms.runtime.launch_blocking()
mint.norm = lambda x, *a, **k: ops.norm(x)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from msprobe.mindspore import PrecisionDebugger  # noqa: E402  (the reference tool)
from ref_net import dumped_step  # noqa: E402


def run(out_dir: str, factor: float) -> None:
    cfg = {"task": "statistics", "dump_path": out_dir, "rank": [], "step": [], "level": "mix",
           "statistics": {"scope": [], "list": [], "data_mode": ["all"], "summary_mode": "statistics"}}
    cfg_path = out_dir + "_config.json"
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)
    dumped_step(PrecisionDebugger(config_path=cfg_path), factor)
    os.remove(cfg_path)


if __name__ == "__main__":
    root = sys.argv[1]
    name, factor = sys.argv[2], float(sys.argv[3])
    target = os.path.join(root, name)
    shutil.rmtree(target, ignore_errors=True)
    run(os.path.abspath(target), factor)
