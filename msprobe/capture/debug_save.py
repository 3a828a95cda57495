"""Debug level: ``PrecisionDebugger.save(variable, name, save_backward=True)`` (seed: "save").

Each call records ``{name}.{count}.debug`` (``count`` per name, per step) in ``debug.json`` with the
value walked like any record (dict -> object, list/tuple -> array). With ``save_backward`` the entry
``{name}_grad.{count}.debug`` gets the same nested shape filled with null, and each tensor leaf gets
a ``Tensor.register_hook``: its gradient replaces the null at the same place when it arrives. Tensor
files are ``{name}.{count}.debug.{index path}.npy``.
"""
from __future__ import annotations

import logging

from mindspore import Tensor

from msprobe.format import journal, naming

logger = logging.getLogger("msprobe")

_LEAF_TYPES = (Tensor, int, float, str)  # bool is an int
MAX_DEPTH = 64


def check_save_args(variable, name, save_backward) -> str | None:
    """Why the arguments are refused, or None when they are fine."""
    if not isinstance(name, str) or not name:
        return f"name must be a non-empty str, got {name!r}"
    if not isinstance(save_backward, bool):
        return f"save_backward must be True or False, got {save_backward!r}"
    problem = _check_variable(variable, 0)
    if problem:
        return f"variable {problem}; allowed: mindspore.Tensor, int, float, str, or list/tuple/dict of them"
    return None


def _check_variable(value, depth):
    if depth > MAX_DEPTH:
        return f"is nested deeper than {MAX_DEPTH} levels"
    if isinstance(value, _LEAF_TYPES):
        return None
    if isinstance(value, (list, tuple)):
        return next(filter(None, (_check_variable(v, depth + 1) for v in value)), None)
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            return "has a dict key that is not a str"
        return next(filter(None, (_check_variable(v, depth + 1) for v in value.values())), None)
    return f"has an element of type {type(value).__name__}"


def _null_shape(value):
    if isinstance(value, Tensor):
        return None
    if isinstance(value, (list, tuple)):
        return [_null_shape(v) for v in value]
    if isinstance(value, dict):
        return {k: _null_shape(v) for k, v in value.items()}
    return None


def _tensor_paths(value, path=()):
    if isinstance(value, Tensor):
        yield path, value
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _tensor_paths(v, path + (i,))
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _tensor_paths(v, path + (k,))


def save(runtime, variable, name: str, save_backward: bool = True) -> None:
    """Record ``variable`` under ``name`` for the current step (see module docstring).

    Bad arguments in a dumped step are refused with a WARNING naming ``name`` and the problem, once
    per name and problem in the run; the training goes on.
    """
    cfg = runtime.config
    if not cfg.dumps_step(runtime.step):
        return
    problem = check_save_args(variable, name, save_backward)
    if problem:
        if runtime.first_time(("save refused", repr(name), problem)):
            logger.warning("msprobe: PrecisionDebugger.save(..., %r) refused: %s (said once for this name; "
                           "nothing is recorded for it while the problem lasts)", name, problem)
        return
    with runtime.tool_code():
        token = runtime.open_step()
        count = runtime.next_count(naming.debug_counter(name))
        entry = naming.debug_entry(name, count)
        runtime.record_value(entry, variable, token)
        if save_backward:
            grad_entry = naming.debug_grad_entry(name, count)
            tensors = list(_tensor_paths(variable))
            if tensors:
                with runtime.lock:
                    runtime.queue_line(journal.value_line(grad_entry, _null_shape(variable)), token)
                for path, tensor in tensors:
                    tensor.register_hook(_grad_hook(runtime, grad_entry, path, token))


def _grad_hook(runtime, grad_entry: str, path: tuple, token):
    file_entry = naming.item_name(grad_entry, *path)

    def hook(grad):
        runtime.record_at(grad_entry, path, grad, file_entry, token)
    return hook
