"""``PrecisionDebugger``: the seed's interface (seed: "msprobe.mindspore.PrecisionDebugger").

Typical use (PyNative)::

    debugger = PrecisionDebugger(config_path="./config.json")
    for data, label in batches:
        debugger.start(model)      # model needed for L0, mix and L1 Primitive capture
        loss = train_step(data, label)
        debugger.stop()
        debugger.step()

or, with the same meaning, a ``with`` block around the step's computation::

    for data, label in batches:
        with debugger.dump(model):     # debugger.start(model) ... debugger.stop()
            loss = train_step(data, label)
        debugger.step()

``with debugger:`` is the same block without a model argument (``start()``; a model given earlier
with ``start(model)`` or ``dump(model)`` is used again). The block's exception reaches the caller
unchanged (same object, no frame of the tool added to its traceback); the step is marked abnormal
and its records so far are kept.

``debugger.close()`` ends the dump before the process does: the pending files are written and every
wrapper and hook is removed (the network runs MindSpore's own functions, Primitives and Cells again).
A closed debugger cannot start again: create a new ``PrecisionDebugger`` to dump again.
"""
from __future__ import annotations

import logging
import os
import weakref

from msprobe.engine.config import ConfigError, load_config
from msprobe.mindspore.service import DumpService

logger = logging.getLogger("msprobe")


def _check_non_negative_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(name, value, "an integer >= 0", kind="argument")
    if value < 0:
        raise ConfigError(name, value, "an integer >= 0", kind="argument")
    return value


def _prepare_dump_path(path: str) -> None:
    """Create ``dump_path``; a missing or read-only parent, a parent that is a file and a path that
    is a file are refused before training starts (:class:`ConfigError` naming ``dump_path``)."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise ConfigError("dump_path", path, "a writable directory (existing or to be created)",
                          reason=f"{path!r} is an existing file, not a directory")
    parent = os.path.dirname(path.rstrip(os.sep)) or "."
    if not os.path.isdir(parent):
        blocker = _existing_ancestor(parent)
        reason = (f"{blocker!r} is a file, not a directory" if os.path.exists(blocker)
                  and not os.path.isdir(blocker) else f"parent directory {parent!r} does not exist")
        raise ConfigError("dump_path", path, "a path whose parent directory exists", reason=reason)
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise ConfigError("dump_path", path, "a writable directory", reason=str(exc)) from exc
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError("dump_path", path, "a writable directory", reason="permission denied")


def _existing_ancestor(path: str) -> str:
    """``path`` or its nearest ancestor that exists (a directory, or a file standing where a
    directory of the path should be)."""
    while not os.path.exists(path):
        up = os.path.dirname(path)
        if up == path:
            break
        path = up
    return path


class PrecisionDebugger:
    """Configure and drive a precision data dump.

    Args:
        config_path (str | os.PathLike | None): config.json; ``None`` uses the packaged default.
        task (str | None): overrides the file's ``task`` (and selects that section).
        dump_path (str | None): overrides ``dump_path``.
        level (str | None): overrides ``level`` (``L0``, ``L1``, ``L2``, ``mix``, ``debug``).
        step (list | None): overrides ``step`` (same syntax as the file: ``[0, "2-4"]``).

    Raises:
        ConfigError: any invalid value; the message names the field, the value and what is allowed.
    """

    #: the most recently created debugger, held weakly (``MsprobeInitStep`` finds it here)
    _latest = None

    def __init__(self, config_path=None, task=None, dump_path=None, level=None, step=None):
        self.config = load_config(config_path, task=task, dump_path=dump_path, level=level, step=step)
        _prepare_dump_path(self.config.dump_path)
        self.service = DumpService(self.config)
        self.closed = False  #: :meth:`close` was called
        PrecisionDebugger._latest = weakref.ref(self)

    def close(self) -> None:
        """Remove the tool before the process exits (otherwise done at exit).

        Writes what is pending (the open step, marked ``abnormal`` when ``stop()`` was not called,
        e.g. after an exception in the step; queued tensor files), then removes every wrapper,
        Primitive hook, Cell hook and patch this debugger installed (custom APIs too), and gives back
        the process settings it changed (``sys.excepthook``, signal handlers, environment
        variables). Calling it again does nothing. Afterwards :meth:`start`, :meth:`dump`,
        :meth:`step`, :meth:`set_init_step` and :meth:`register_custom_api` raise ``RuntimeError``
        (create a new ``PrecisionDebugger`` to dump again); :meth:`stop` does nothing, :meth:`save`
        records nothing (a WARNING).

        A failure of the tool while closing is logged (WARNING) and not raised.

        Raises:
            Like :meth:`stop`, a failure of your computation the tool met and has not raised yet
            (after the tool is removed).
        """
        if self.closed:
            return
        self.closed = True
        if PrecisionDebugger.latest() is self:
            PrecisionDebugger._latest = None
        service = self.service
        try:
            if service.active:
                service.note_abnormal("close() was called while the step was recording (no stop() after "
                                      "start()); records up to that point are kept")
            service.close()
        except Exception as exc:  # the tool's own failure: the training goes on
            logger.warning("msprobe: close() could not finish the dump cleanly: %r", exc)
        service.runtime.raise_user_error(final=True)

    def _check_open(self, what: str) -> None:
        if self.closed:
            raise RuntimeError(f"msprobe: {what}() on a closed PrecisionDebugger (close() was called); "
                               "create a new PrecisionDebugger to dump again")

    @classmethod
    def latest(cls):
        """The most recently created debugger that still exists, or ``None``."""
        ref = cls._latest
        return ref() if ref is not None else None

    def __enter__(self):
        """``with debugger:`` — :meth:`start` (without a model: give it once with ``start(model)``
        or use :meth:`dump`); the block's end is :meth:`stop`. Call :meth:`step` after the step."""
        self.start()
        return self

    def __exit__(self, exc_type, exc, tb):
        self._stop_after(exc)
        return False  # the block's exception, if any, goes on unchanged

    def dump(self, model=None, token_range=None, rank_id=None) -> "_DumpBlock":
        """``with debugger.dump(model):`` — :meth:`start` with these arguments when the block is
        entered, :meth:`stop` at its end, also when it raises (the exception reaches the caller
        unchanged). Call :meth:`step` after the step. The ``with`` statement's ``as`` target is the
        debugger. Arguments and what is raised when the block is entered: as :meth:`start`.

        Raises:
            RuntimeError: at this call already when the debugger was closed (:meth:`close`).
        """
        self._check_open("dump")
        return _DumpBlock(self, model, token_range, rank_id)

    def _stop_after(self, exc) -> None:
        if exc is None:
            self.stop()
            return
        try:  # the block raised: its exception goes on unchanged, whatever stop() meets
            self.service.note_abnormal(f"the with-block raised {type(exc).__name__}: {exc}; records up "
                                       "to that point are kept")
            self.stop()
        except Exception as stop_exc:
            logger.warning("msprobe: stop() after the exception %r failed: %r", exc, stop_exc)

    def start(self, model=None, token_range=None, rank_id=None) -> None:
        """Start recording for the current step (seed: "start").

        Args:
            model (nn.Cell | list[nn.Cell] | tuple[nn.Cell] | None): network whose sub-Cells are hooked
                (L0, mix) and whose Primitives are hooked (L1). Its root is not recorded itself.
            token_range (list[int, int] | None): inference only: dump forward passes start..end
                (inclusive) of the model; needs ``model``.
            rank_id (int | None): rank directory name to use instead of ``get_rank()``.

        Raises:
            ConfigError: bad ``rank_id`` or ``token_range``. TypeError: bad ``model``.
            ValueError: L0/mix without any model given.
            RuntimeError: the debugger was closed (:meth:`close`).
        """
        self._check_open("start")
        if rank_id is not None:
            self.service.runtime.rank_override = _check_non_negative_int("rank_id", rank_id)
        if model is not None:
            self.service.set_model(model)
        if token_range is not None:
            self.service.set_token_range(token_range)
        self.service.start()

    def stop(self) -> None:
        """Stop recording and write dump.json, stack.json and construct.json so far (seed: "stop").

        Raises:
            The exception of an operation of yours that failed asynchronously (MindSpore's default
            launch) and that only the tool's final read of this step synchronised: unchanged, after
            the files are written.
        """
        self.service.stop()

    def step(self) -> None:
        """End the step: stop if needed, close its directory, advance the step number (seed: "step").
        Shows where the step's files are (``dump.json is at <path>``, as the seed prints).

        Raises:
            Like :meth:`stop`, a failure of your computation the tool met and has not raised yet.
            RuntimeError: the debugger was closed (:meth:`close`).
        """
        self._check_open("step")
        self.service.step()

    def set_init_step(self, step: int) -> None:
        """Number the current step ``step`` (seed: "set_init_step"); call before the training loop.

        Raises:
            ConfigError: ``step`` is not an integer >= 0.
            RuntimeError: the debugger was closed (:meth:`close`).
        """
        self._check_open("set_init_step")
        self.service.set_init_step(_check_non_negative_int("step", step))

    def save(self, variable, name, save_backward=True) -> None:
        """Record a variable's value, and its gradient, at the debug level (seed: "save").

        Args:
            variable (Tensor | int | float | str | list | tuple | dict): nested structures of those.
            name (str): entry name; calls are numbered per name within a step.
            save_backward (bool): also record the gradient flowing back into each tensor.

        Bad arguments are refused with a WARNING naming the problem, and so is a call after
        :meth:`close` (nothing is recorded); training is never interrupted.
        """
        if self.closed:
            logger.warning("msprobe: save(%r) after close(): nothing is recorded", name)
            return
        self.service.save(variable, name, save_backward)

    def register_custom_api(self, module, api, api_prefix=None) -> None:
        """Capture ``module.<api>`` at L1 under ``api_prefix`` (seed: "register_custom_api").

        Raises:
            ConfigError: ``module`` has no function ``api``, or ``api_prefix`` is not a str.
            RuntimeError: the debugger was closed (:meth:`close`).
        """
        self._check_open("register_custom_api")
        self.service.register_custom_api(module, api, api_prefix)

    def restore_custom_api(self, module, api) -> None:
        """Restore the original ``module.<api>`` (seed: "restore_custom_api")."""
        self.service.restore_custom_api(module, api)


class _DumpBlock:
    """The context manager :meth:`PrecisionDebugger.dump` returns (a class, not a generator, so the
    block's exception passes through without a frame of the tool added to its traceback)."""

    def __init__(self, debugger: PrecisionDebugger, model, token_range, rank_id):
        self._debugger = debugger
        self._start_args = (model, token_range, rank_id)

    def __enter__(self) -> PrecisionDebugger:
        model, token_range, rank_id = self._start_args
        self._debugger.start(model, token_range=token_range, rank_id=rank_id)
        return self._debugger

    def __exit__(self, exc_type, exc, tb):
        return self._debugger.__exit__(exc_type, exc, tb)
