"""Call semantics both recorders (API and Primitive calls, asynchronous handles), the Cell hooks and
the in-place guard use: which calls write their arguments (by API name, or a Primitive's attributes),
what a call's forward ``output`` is."""
from __future__ import annotations


_AUGMENTED = {"add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "and", "or", "xor",
              "lshift", "rshift", "div"}


#: ``mint.distributed`` collectives (torch style) that write their result into an argument:
#: name -> (position, keyword) of that argument. They count as in-place (inputs are read before the
#: call) and, when they return ``None`` (synchronous), their ``output`` is that argument after the call.
COLLECTIVE_WRITES = {
    "all_reduce": (0, "tensor"), "broadcast": (0, "tensor"), "reduce": (0, "tensor"),
    "recv": (0, "tensor"), "irecv": (0, "tensor"), "scatter": (0, "tensor"),
    "all_gather": (0, "tensor_list"), "gather": (1, "gather_list"),
    "all_gather_into_tensor": (0, "output_tensor"), "reduce_scatter": (0, "output"),
    "reduce_scatter_tensor": (0, "output"), "all_to_all": (0, "output_tensor_list"),
    "all_to_all_single": (0, "output"),
}


def is_inplace(api_name: str) -> bool:
    """In-place by naming convention: ``add_``, ``__iadd__``, ``__setitem__``, ``assign*``; plus the
    ``MintDistributed`` collectives of :data:`COLLECTIVE_WRITES`."""
    head, _, short = api_name.rpartition(".")
    if head == "MintDistributed":
        return short in COLLECTIVE_WRITES
    if short.startswith("__"):  # only augmented assignments (not __init__, __iter__, __int__, ...)
        return (short.startswith("__i") and short.endswith("__") and short[3:-2] in _AUGMENTED) \
            or short == "__setitem__"
    if short.startswith("_"):  # private helpers such as _convert_scalar_ are not user in-place ops
        return False
    return ((short.endswith("_") and not short.endswith("__"))
            or short == "__setitem__" or short.startswith("assign") or short.startswith("scatter_nd_")
            or short.startswith("inplace_"))


def primitive_is_inplace(prim) -> bool:
    """A Primitive writes its inputs when MindSpore marks it ``side_effect_mem`` (``Assign``,
    ``ScatterUpdate``, optimizer kernels such as ``ApplyMomentum``): its ``attrs`` say so."""
    attrs = getattr(prim, "attrs", None) or {}
    return bool(attrs.get("side_effect_mem", False))


def as_output_list(out):
    """Forward ``output`` is a list: a single value becomes a 1-element list, a tuple a
    list; a namedtuple stays an object keyed by field name (stable paths such as ``output.logits``)."""
    if isinstance(out, (list, tuple)):  # a namedtuple is described as an object by records.py
        return out
    return [out]


def written_output(api: str, args: tuple, kwargs: dict, out):
    """The forward ``output`` of a call: its return value, except for a synchronous ``MintDistributed``
    collective (returns ``None``), whose result is the argument it wrote (e.g. ``all_reduce(tensor)``)."""
    head, _, short = api.rpartition(".")
    if out is not None or head != "MintDistributed" or short not in COLLECTIVE_WRITES:
        return out
    position, keyword = COLLECTIVE_WRITES[short]
    if len(args) > position:
        return args[position]
    return kwargs.get(keyword)
