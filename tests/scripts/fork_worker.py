"""Fork worker for tests/test_reliability.py (run in a fresh process: forking a process that already
ran many MindSpore threads, such as the pytest process, can deadlock inside MindSpore itself).

``fork_worker.py DUMP_PATH``: starts an L1 tensor dump, records ``ops.relu``, then

1. a ``multiprocessing`` child (start method ``fork``) calls ops and even ``debugger.stop()/step()``;
2. an ``os.fork()`` child calls ops and runs msprobe's exit handler (which finishes the dump at exit);

and after each checks that the dump directory is byte-for-byte unchanged. Then the parent records a
second ``ops.relu`` and finishes the step. Prints ``RESULT {json}``.
"""
import json
import multiprocessing
import os
import sys
import weakref

import mindspore as ms

ms.set_device("CPU")
ms.runtime.launch_blocking()

import numpy as np  # noqa: E402
from mindspore import Tensor, ops  # noqa: E402

from msprobe.mindspore import PrecisionDebugger  # noqa: E402
from msprobe.mindspore.service import _close_at_exit  # noqa: E402


def tree(path):
    out = {}
    for base, _, files in os.walk(path):
        for name in files:
            full = os.path.join(base, name)
            st = os.stat(full)
            out[os.path.relpath(full, path)] = [st.st_size, st.st_mtime_ns]
    return out


def mp_child(x, queue):
    out = ops.relu(x) + 1                       # ops after start(), in the child
    debugger = PrecisionDebugger.latest()
    debugger.stop()                             # the child's stop/step must not write either
    debugger.step()
    queue.put(out.asnumpy().tolist())


def main(dump_path):
    debugger = PrecisionDebugger(dump_path=dump_path, level="L1", task="tensor")
    x = Tensor(np.array([-1.0, 2.0], np.float32))
    debugger.start()
    ops.relu(x)
    debugger.service.runtime.flush()            # the parent's journal holds data before the fork
    result = {"before": tree(dump_path)}

    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=mp_child, args=(x, queue))
    child.start()
    try:
        result["mp_child_value"] = queue.get(timeout=60)
    except Exception as exc:  # reported, the test fails on it
        result["mp_child_value"] = repr(exc)
    child.join(30)
    if child.exitcode is None:
        child.kill()
    result["mp_child_exitcode"] = child.exitcode
    result["after_mp_child"] = tree(dump_path)

    pid = os.fork()
    if pid == 0:
        ops.relu(x * 5)
        # msprobe's atexit handler (it finishes the dump at exit), then os._exit: MindSpore 2.10 itself
        # aborts when a forked child exits normally, with or without msprobe ("terminate called
        # after throwing an instance of 'std::system_error'", from its own exit handlers)
        _close_at_exit(weakref.ref(debugger.service))
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    result["fork_child_status"] = status
    result["after_fork_child"] = tree(dump_path)

    ops.relu(x * 2)
    debugger.stop()
    debugger.step()
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
