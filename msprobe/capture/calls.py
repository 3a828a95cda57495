"""Recording one API-like call (API, Primitive, custom API): forward inputs, outputs, backward.

Order inside a call, chosen so statistics describe the values the call saw:
inputs described -> (in-place call: pending batch flushed, so inputs and every earlier record are read
before the mutation) -> original called -> outputs described -> gradient hooks registered.
Anything the tool itself fails at is logged to ``dump_error_info.log`` and the call goes on; errors
raised by the original API reach the user unchanged.

The common case, :meth:`CallRecorder.fast_call` (a call that writes no tensor, with a config that
selects every entry and writes statistics only: :meth:`Runtime.takes_whole_calls`), makes the same
records with a fraction of the Python calls: inputs and output are described into one body and
queued after the call with its stack as one journal line (:meth:`Runtime.begin_call`,
:meth:`Runtime.end_call`). Nothing else runs between a call's inputs and its output on the calling
thread (calls made inside a recorded call are not recorded), so the journal replays to the same
files; a call whose inputs cannot be described this way takes the general path's recording.
"""
from __future__ import annotations

import logging

from mindspore import Tensor

from msprobe.capture.async_handles import defer_until_wait
from msprobe.capture.backward import BackwardProbe, grad_enabled, grad_enabled_fn
from msprobe.capture.semantics import as_output_list, written_output
from msprobe.format import naming
from msprobe.tensors import hotpath

logger = logging.getLogger("msprobe")

#: entry prefixes of collectives: their output may be an argument they write, or come at a work
#: handle's ``wait()`` (the general path decides)
_COLLECTIVES = ("Distributed.", "MintDistributed.")


class CallRecorder:
    """Records calls of API-like functions into the runtime."""

    def __init__(self, runtime):
        self.rt = runtime
        self.fwd_in, self.fwd_out, self.bwd_in, self.bwd_out = runtime.data_flags()
        self._whole = runtime.takes_whole_calls()
        #: what records a call of :meth:`has_fast_path`: :meth:`fast_call`, in C when the extension
        #: is built (``hotpath.ext.Recorder``, the same records; it hands every case but the common
        #: one back to the methods here)
        self.fast_record = self.fast_call
        ext = hotpath.ext
        if self._whole and ext is not None:
            parts = runtime.compiled_call_parts()
            parts.update(slow=self._call, python=self.fast_call, finish=self._finish,
                         tool_error=self._tool_error, probe=BackwardProbe, grad_enabled=grad_enabled_fn(),
                         backward_of=naming.backward_of, bwd_in=self.bwd_in, bwd_out=self.bwd_out,
                         backward=self.bwd_in or self.bwd_out)
            self.fast_record = ext.Recorder(runtime, hotpath, parts)

    def has_fast_path(self, api: str, inplace: bool) -> bool:
        """Whether calls of ``api`` go through :meth:`fast_call`: not an in-place API, not a
        collective (whose output may be an argument it writes, or come at a handle's ``wait()``),
        and a config that allows it (:meth:`Runtime.takes_whole_calls`)."""
        return self._whole and not inplace and not api.startswith(_COLLECTIVES)

    def fast_call(self, api: str, original, args: tuple, kwargs: dict, inplace: bool = False):
        """:meth:`call` for an API of :meth:`has_fast_path` (``inplace`` is False): the same records,
        the same errors, the same user exceptions."""
        rt = self.rt
        if rt.recomputing or rt.failed:
            return self._call(api, original, args, kwargs)
        rt.enter()
        try:
            probe = body = fwd = None
            edges = ()
            try:
                n, body, slots = rt.begin_call(api, args, kwargs)
                fwd = naming.api_entry(api, n, naming.FORWARD)
                if body is None:  # the general path records the inputs and decides about the failure
                    self._record_inputs(fwd, args, kwargs)
                if (self.bwd_in or self.bwd_out) and grad_enabled():
                    bwd = naming.api_entry(api, n, naming.BACKWARD)
                    probe = BackwardProbe(rt, bwd, self.bwd_in, self.bwd_out)
                    if rt.track_parents:
                        edge = (bwd, naming.backward_of(self._parent()))
                        if body is None:
                            rt.record_parent(*edge)
                        else:
                            edges = (edge,)
                if rt.track_parents and body is not None:
                    edges = ((fwd, self._parent()),) + edges
            except Exception as exc:
                self._tool_error(api, exc, (args, kwargs))
                probe = body = fwd = None
            try:
                out = original(*args, **kwargs)
            except BaseException as exc:  # the inputs are recorded, the user's exception goes on
                if body is not None:
                    self._finish(api, fwd, body, slots, edges, args, kwargs, None, None, exc)
                elif fwd is not None:
                    self._record_raised(api, fwd, exc)
                raise
            if fwd is None:
                return out
            if body is not None:
                self._finish(api, fwd, body, slots, edges, args, kwargs, out, probe, None)
                return out
            try:  # inputs recorded by the general path: so is the output
                if not defer_until_wait(rt, fwd, api, args, kwargs, out):
                    rt.record(fwd, "output", as_output_list(out), "output")
                if probe is not None:
                    probe.observe(args, out)
            except Exception as exc:
                self._tool_error(api, exc, out)
            return out
        finally:
            rt.leave()

    def _finish(self, api: str, fwd: str, body: dict, slots: list, edges: tuple, args: tuple, kwargs: dict,
                out, probe, raised) -> None:
        """The end of :meth:`fast_call` for a call whose inputs are described into ``body``: its output
        ``out`` described and queued with them (:meth:`Runtime.end_call`; an output that comes at an
        asynchronous ``wait()`` later), then ``probe`` (a :class:`BackwardProbe` or ``None``) hooks
        its gradients; ``raised``: ``None``, or the exception the original raised (then the inputs are
        queued with the entry's ``error``, and no output). A failure of the tool is reported
        (:meth:`_tool_error`), never raised."""
        rt = self.rt
        if raised is not None:
            try:
                rt.end_call(fwd, body, slots, None, edges)
            except Exception as exc:
                self._tool_error(api, exc, (args, kwargs))
                return
            self._record_raised(api, fwd, raised)
            return
        try:
            if type(out) is not Tensor and defer_until_wait(rt, fwd, api, args, kwargs, out):
                rt.end_call(fwd, body, slots, None, edges)
            else:
                rt.end_call(fwd, body, slots, [out] if type(out) is Tensor else as_output_list(out), edges)
            if probe is not None:
                probe.observe(args, out)
        except Exception as exc:
            self._tool_error(api, exc, out)

    def call(self, api: str, original, args: tuple, kwargs: dict, inplace: bool = False,
             mutates: bool = False):
        """Run ``original(*args, **kwargs)`` as API ``api`` (``"{prefix}.{name}"``) and record it.

        ``inplace``: the call writes its arguments (they are read before it, no input gradients).
        ``mutates``: the call may write tensors it is not given (a compiled region such as an
        optimizer assigning Parameters): everything pending is read before it runs. ``True``, or a
        callable without arguments returning the tensors it may write (``None``: any), which
        spares the queued ``.npy`` files that read other memory a copy
        (:meth:`msprobe.engine.tensor_files.FileQueue.protect`)."""
        if self._whole and not (inplace or mutates) and not api.startswith(_COLLECTIVES):
            return self.fast_record(api, original, args, kwargs)
        return self._call(api, original, args, kwargs, inplace, mutates)

    def _call(self, api: str, original, args: tuple, kwargs: dict, inplace: bool = False,
              mutates: bool = False):
        """:meth:`call` without the common case's path."""
        rt = self.rt
        rt.enter()
        try:
            probe = None
            try:
                n = rt.next_count(api)
                fwd = naming.api_entry(api, n, naming.FORWARD)
                # a recomputed forward (Cell.recompute) was recorded the first time it ran
                selected = not rt.recomputing and rt.selector.selects(fwd)
                if selected:
                    self._record_inputs(fwd, args, kwargs)
                # the backward entry is selected on its own name (a list may name only it)
                if (self.bwd_in or self.bwd_out) and grad_enabled():
                    bwd = naming.api_entry(api, n, naming.BACKWARD)
                    if rt.selector.selects(bwd):
                        # gradients w.r.t. the arguments: not of an in-place API (its argument is its
                        # output); a Primitive writing some arguments (side_effect_mem: BatchNorm's
                        # moving statistics) has them w.r.t. the others
                        inputs = self.bwd_out and not (inplace and not api.startswith("Primitive."))
                        probe = BackwardProbe(rt, bwd, self.bwd_in, inputs)
                        if rt.track_parents:
                            rt.record_parent(bwd, naming.backward_of(self._parent()))
                if (inplace or mutates) and rt.has_pending:  # read before the change; files may follow
                    rt.flush(settle=False, written=mutates if callable(mutates) and not inplace else None)
            except Exception as exc:  # tool failure (or the user's, asynchronous launch): keep training
                self._tool_error(api, exc, (args, kwargs))
                selected, probe = False, None
            if inplace or mutates:  # watch mode's raise: before the call changes any tensor
                rt.raise_watch_anomaly()
            try:
                out = original(*args, **kwargs)
            except BaseException as exc:  # the user's exception goes on
                if selected:
                    self._record_raised(api, fwd, exc)
                raise
            if selected or probe is not None:
                try:
                    if selected and self.fwd_out and not defer_until_wait(rt, fwd, api, args, kwargs, out):
                        rt.record(fwd, "output", as_output_list(written_output(api, args, kwargs, out)),
                                  "output")
                    if probe is not None:
                        probe.observe(args, out)
                except Exception as exc:
                    self._tool_error(api, exc, out)
            return out
        finally:
            rt.leave()

    def _record_inputs(self, fwd: str, args: tuple, kwargs: dict) -> None:
        rt = self.rt
        rt.record_stack(fwd)
        if rt.track_parents:
            rt.record_parent(fwd, self._parent())
        if self.fwd_in:
            rt.record(fwd, "input_args", args, "input")
            rt.record(fwd, "input_kwargs", kwargs, "kwargs")

    def _record_raised(self, api: str, fwd: str, exc: BaseException) -> None:
        """The forward call ``fwd`` raised ``exc`` (which goes on to the program unchanged): its entry
        gets ``error`` (:meth:`Runtime.record_raised`) when outputs are recorded."""
        if not self.fwd_out:
            return
        try:
            self.rt.record_raised(fwd, exc)
        except Exception as failure:
            self._tool_error(api, failure, None)

    def _parent(self):
        stack = self.rt.cell_stack
        return stack[-1] if stack else None

    def _tool_error(self, api: str, exc: Exception, value) -> None:
        """Report ``exc`` met while recording ``value`` (the call's arguments or output), unless it is
        the user's own failed operation surfacing in tool code (then it reaches the user instead)."""
        if not self.rt.claim_user_failure(exc, value):
            self.rt.tool_error(f"failed to record {api}: {exc!r}", key=(api, type(exc)))
