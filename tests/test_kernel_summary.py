"""Reading L2 dumps back: summarize() reports kernel steps and names the first NaN kernel (no false
"none"), from statistic.csv (statistics task) or the saved tensors (tensor task)."""
import re
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import sys, numpy as np, mindspore as ms
    from mindspore import nn, ops, Tensor
    ms.set_device("CPU"); ms.set_context(mode=ms.GRAPH_MODE)
    from msprobe.mindspore import PrecisionDebugger
    from msprobe.dump import summarize, iter_kernel_steps, load_kernel_statistics
    dump_path, task = sys.argv[1], sys.argv[2]
    debugger = PrecisionDebugger(dump_path=dump_path, level="L2", task=task)
    debugger.start()                       # before the first graph is compiled

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.fc = nn.Dense(4, 2)

        def construct(self, x):
            return ops.log(self.fc(x) - 10)   # log of a negative number: NaN

    Net()(Tensor(np.ones((2, 4), np.float32)))
    debugger.stop()
    debugger.step()
    steps = list(iter_kernel_steps(dump_path))
    print("STEPS", len(steps), "ROWS", len(load_kernel_statistics(steps[0][2])))
    print(summarize(dump_path))
""")


@pytest.mark.parametrize("task", ["statistics", "tensor"])
def test_summarize_names_first_nan_kernel(tmp_path, task):
    dump = str(tmp_path / "dump")
    script = tmp_path / "l2_nan.py"        # graph compilation reads the Cell's source from a file
    script.write_text(SCRIPT)
    out = subprocess.run([sys.executable, str(script), dump, task], capture_output=True, text=True,
                         timeout=240, cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr[-2000:]
    text = out.stdout
    assert "STEPS 1" in text
    rows = int(text.split("ROWS ")[1].split()[0])
    assert (rows > 0) == (task == "statistics")
    line = next(l for l in text.splitlines() if "first kernel tensor with a non-finite value" in l)
    assert "Log" in line and "none" not in line, text
    assert "CPU device is not supported" not in out.stdout + out.stderr
    # at exit, one line says where the kernel dump is
    said = [l for l in text.splitlines() if "L2 kernel dump" in l]
    assert len(said) == 1 and re.fullmatch(rf"the L2 kernel dump is at {re.escape(dump)}: 1 step directory "
                                           r"\(rank_0/\d+/step_0\)", said[0]), said
