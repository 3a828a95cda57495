"""Coverage gaps the dump cannot close itself, made visible.

L1 capture replaces module attributes (``mindspore.ops.relu`` and its other public names, see
:mod:`msprobe.capture.api`) while the dump runs, and hooks the Primitive instances the model's Cells
hold. Three ways of calling escape it, and cannot be detected per call; instead, at ``start()`` the
user's modules are scanned: the ``__main__`` module and the modules defining the model's Cell classes
(MindSpore's and msprobe's own modules excluded).

* *stale bindings*: a name bound before ``start()`` — ``from mindspore.ops import relu`` at the top of
  a script — still points to MindSpore's own function;
* *unwrapped module attributes*: a MindSpore module bound to a name (``import
  mindspore.ops.auto_generate.gen_ops_def as G``) whose attribute the module's code uses (``G.cast``)
  is a listed function, but that attribute is not wrapped: the module is not one whose attributes
  are wrapped, or the function is listed for another namespace only (``mint.cumprod`` is
  ``ops.cumprod``; only ``ops`` lists it);
* *Primitives created per call*: ``P.Reshape()(x, shape)`` in a Cell's ``construct`` or ``bprop``
  makes a new Primitive at each call, which no Cell holds, so it is not hooked (found in the
  bytecode: a Primitive class called with constant arguments only).

Each one found is logged once per run as a WARNING and listed in the step's ``coverage.json`` under
``not_captured``, with the module, the name and how to call it so that it is captured.

The module-level caches below hold no state of a run: each is a function of code only — the listed
APIs' original functions (``_originals_cache``, keyed by the target list), the bytecode of a user
module (``_chains_cache``, kept with the module object so a reloaded module is read again) and of a
Cell class (``_inline_cache``, weak keys: a dropped class takes its entry with it), the wrapped
``(owner, attribute)`` keys of the target and alias lists (``_wrapped_cache``, kept with the lists)
and, in :mod:`msprobe.capture.api`, the alias modules (once per process). Scanning the same code
again would give the same answer; which warnings were already given belongs to the run
(:meth:`msprobe.engine.runtime.Runtime.first_time`). What depends on the namespaces (which names of
a user module hold an original, what a ``G.attr`` chain reaches, which Cells the model has) is
read again at every ``start()``: a name can be rebound at any time, and re-reading is one dict
look-up per name, about as cheap as any fingerprint that would tell a change (≈0.1 ms per start on
the benchmark LM). The scan gives the same answer while the capture is parked (wrapped attributes
hold wrappers then): wrapped attributes are never reported, and the originals are read once, before
the first install.
"""
from __future__ import annotations

import dis
import logging
import sys
import types
import weakref

from mindspore.ops import Primitive

logger = logging.getLogger("msprobe")

_SKIP_PREFIXES = ("mindspore", "msprobe", "numpy", "builtins")
_originals_cache: dict = {}
_chains_cache: dict = {}  # module name -> (module, its "G.attr" chains)
_inline_cache = weakref.WeakKeyDictionary()  # Cell class -> its "Primitive created per call" items
_wrapped_cache: dict = {}  # "keys" -> (targets, aliases, their wrapped keys and alias module names)


def _originals(targets: list) -> dict:
    """``id(original) -> (original, api, qualified attribute)`` for the listed APIs (cached)."""
    key = id(targets)
    cached = _originals_cache.get(key)
    if cached is not None and cached[0] is targets:
        return cached[1]
    found = {}
    for owner, attr, api in targets:
        obj = getattr(owner, attr, None)
        if obj is None or isinstance(obj, type):
            continue
        owner_name = getattr(owner, "__name__", type(owner).__name__)
        found.setdefault(id(obj), (obj, api, f"{owner_name}.{attr}"))  # one object, several names: first
    _originals_cache.clear()
    _originals_cache[key] = (targets, found)
    return found


def _cell_classes(models) -> list:
    """The distinct classes of every Cell in ``models`` (one walk of the Cell trees)."""
    classes = {}
    for _, root in models or ():
        for _, cell in root.cells_and_names():
            classes.setdefault(id(type(cell)), type(cell))
    return list(classes.values())


def _user_modules(cell_classes) -> list:
    names = {"__main__"} | {cls.__module__ for cls in cell_classes}
    modules = []
    for name in sorted(names):
        if name is None or name.split(".", 1)[0] in _SKIP_PREFIXES:
            continue
        module = sys.modules.get(name)
        if module is not None:
            modules.append(module)
    return modules


_CHAIN = ("LOAD_ATTR", "LOAD_METHOD")
_CALLS = ("PRECALL", "CALL", "CALL_FUNCTION", "CALL_FUNCTION_KW", "CALL_METHOD", "CALL_KW")


def _chains(code):
    """``(instructions, chains)`` of ``code`` (nested code objects not included): one chain
    ``(names, line, end)`` per ``LOAD_GLOBAL a`` + ``LOAD_ATTR b`` ... run (``a.b...``), ``names`` =
    ``("a", "b", ...)`` and ``end`` the index in ``instructions`` of the instruction after it."""
    ins = list(dis.get_instructions(code))
    chains = []
    line = code.co_firstlineno
    i = 0
    while i < len(ins):
        positions = getattr(ins[i], "positions", None)
        line = (positions.lineno if positions and positions.lineno else None) or ins[i].starts_line or line
        if ins[i].opname != "LOAD_GLOBAL":
            i += 1
            continue
        j = i + 1
        while j < len(ins) and ins[j].opname in _CHAIN:
            j += 1
        chains.append((tuple(op.argval for op in ins[i:j]), line, j))
        i = j
    return ins, chains


def _module_codes(module):
    """Code objects of the functions and class methods defined in ``module`` (nested ones included)."""
    pending, seen = [], set()
    for value in list(vars(module).values()):
        values = vars(value).values() if isinstance(value, type) and value.__module__ == module.__name__ \
            else (value,)
        for item in values:
            code = getattr(getattr(item, "__func__", item), "__code__", None)
            if isinstance(code, types.CodeType):
                pending.append(code)
    while pending:
        code = pending.pop()
        if id(code) in seen:
            continue
        seen.add(id(code))
        yield code
        pending.extend(c for c in code.co_consts if isinstance(c, types.CodeType))


def _module_attribute_chains(module) -> list:
    """``[(names, file, line)]``: ``G.attr...`` runs in ``module``'s code whose head ``G`` is a
    MindSpore module bound in ``module`` (cached per module)."""
    cached = _chains_cache.get(module.__name__)
    if cached is not None and cached[0] is module:
        return cached[1]
    namespace = vars(module)
    heads = {name for name, value in namespace.items()
             if isinstance(value, types.ModuleType) and value.__name__.startswith("mindspore")}
    found = []
    for code in _module_codes(module) if heads else ():
        if heads.isdisjoint(code.co_names):
            continue
        for names, line, _ in _chains(code)[1]:
            if names[0] in heads and len(names) > 1:
                found.append((names, code.co_filename.rsplit("/", 1)[-1], line))
    _chains_cache[module.__name__] = (module, found)
    return found


def _wrapped_keys(targets: list, aliases) -> tuple:
    """``({(id(owner), attribute)} of every wrapped binding, {names of the alias modules}})``, kept
    for the last ``(targets, aliases)`` pair (both are built once per debugger)."""
    cached = _wrapped_cache.get("keys")
    if cached is not None and cached[0] is targets and cached[1] is aliases:
        return cached[2]
    from msprobe.capture.api import alias_modules

    keys = {(id(owner), attr) for owner, attr, _ in list(targets) + list(aliases)}
    found = (keys, frozenset(m.__name__ for m, _ in alias_modules()))
    _wrapped_cache["keys"] = (targets, aliases, found)
    return found


def _unwrapped_attributes(module, originals: dict, wrapped: set, wrapped_modules) -> list:
    """Items for ``G.attr`` uses in ``module`` that reach a listed function through an attribute
    that is not wrapped (a module whose attributes are not wrapped, or a re-export of a function
    listed for another namespace only, such as ``mint.cumprod``); ``wrapped_modules``: names of
    the modules whose attributes are wrapped."""
    out, seen = [], set()
    for names, file, line in _module_attribute_chains(module):
        owner = vars(module).get(names[0])
        for depth, attr in enumerate(names[1:], start=1):
            value = vars(owner).get(attr) if isinstance(owner, types.ModuleType) else None
            hit = originals.get(id(value)) if value is not None else None
            dotted = ".".join(names[:depth + 1])
            if hit is not None and hit[0] is value and (id(owner), attr) not in wrapped and dotted not in seen:
                seen.add(dotted)
                _, api, qualified = hit
                why = (f"{owner.__name__}.{attr} is not in that namespace's list in support_wrap_ops.yaml"
                       if owner.__name__ in wrapped_modules else
                       f"the attributes of {owner.__name__} are not wrapped")
                out.append({"name": dotted, "module": module.__name__, "api": api, "call_as": qualified,
                            "reason": f"'{dotted}' ({file}:{line}) is {qualified}, but {why}: its calls "
                                      f"are not recorded as {api}; call it as {qualified} to have it "
                                      "captured"})
            if value is None:
                break
            owner = value
    return out


def stale_bindings(targets: list, models, aliases=()) -> list:
    """Names in the user's modules bound to the original of a wrapped API (call before wrapping),
    and attributes of MindSpore modules that the user's code reaches without them being wrapped.

    Args:
        targets: ``[(owner, attribute, api)]`` of the listed APIs; ``aliases``: the other wrapped
            bindings of the same functions (:func:`msprobe.capture.api.alias_targets`).
        models: ``[(index, root Cell)]`` or ``None``.

    Returns a list of ``{"name", "module", "api", "call_as", "reason"}`` dicts (nothing is logged).
    """
    originals = _originals(targets)
    wrapped, wrapped_modules = _wrapped_keys(targets, aliases)
    found = []
    cell_classes = _cell_classes(models)
    for module in _user_modules(cell_classes):
        found.extend(_unwrapped_attributes(module, originals, wrapped, wrapped_modules))
        for name, value in list(vars(module).items()):
            hit = originals.get(id(value))
            if hit is None or hit[0] is not value:
                continue
            _, api, qualified = hit
            found.append({"name": name, "module": module.__name__, "api": api, "call_as": qualified,
                          "reason": f"'{name}' in module {module.__name__} was bound to {qualified} "
                                    f"before start(): its calls are not recorded as {api}; call it "
                                    f"as {qualified} (module attribute) to have it captured"})
    found.extend(inline_primitives(models, cell_classes))
    return found


def _primitive_creations(code, namespace: dict):
    """``(Primitive class, line)`` for each ``Class(constants...)`` call in ``code`` (not nested)."""
    ins, chains = _chains(code)
    for names, line, end in chains:
        obj = namespace.get(names[0], _MISSING)
        for attr in names[1:]:
            obj = getattr(obj, attr, _MISSING)
        if not (isinstance(obj, type) and issubclass(obj, Primitive)):
            continue
        k, consts = end, 0
        while k < len(ins) and ins[k].opname in ("LOAD_CONST", "KW_NAMES"):
            consts += ins[k].opname == "LOAD_CONST"
            k += 1
        if k < len(ins) and ins[k].opname in _CALLS:
            argc = (ins[k].arg or 0) + (ins[k].opname == "CALL_FUNCTION_KW")
            if argc == consts:  # the class itself is what is called: a new instance
                yield obj, line


_MISSING = object()


def inline_primitives(models, cell_classes=None) -> list:
    """Primitives the ``construct``/``bprop`` of the model's (user-defined) Cell classes create at
    each call (``P.Cast()(x, t)``): no Cell holds them, so L1 does not hook them. Cached per class.
    ``cell_classes``: the classes of the models' Cells when the caller has them (else read)."""
    found = []
    classes = {}
    for cell_cls in _cell_classes(models) if cell_classes is None else cell_classes:
        for cls in cell_cls.__mro__:
            if cls.__module__.split(".", 1)[0] not in _SKIP_PREFIXES:
                classes[id(cls)] = cls
    for cls in classes.values():
        items = _inline_cache.get(cls)
        if items is None:
            items = []
            for method in ("construct", "bprop"):
                fn = vars(cls).get(method)
                code = getattr(fn, "__code__", None)
                if code is None:
                    continue
                for prim, line in _primitive_creations(code, fn.__globals__):
                    file = code.co_filename.rsplit("/", 1)[-1]
                    where = f"{cls.__qualname__}.{method} ({file}:{line})"
                    items.append({"name": f"{prim.__name__}() in {where}", "module": cls.__module__,
                                  "api": f"Primitive.{prim.__name__}",
                                  "call_as": f"a Primitive held by the Cell (self.<name> = {prim.__name__}() "
                                             "in __init__)",
                                  "reason": f"{where} creates a new {prim.__name__} Primitive each "
                                            "time that line runs; no Cell holds it, so its calls are "
                                            "not recorded. "
                                            f"Create it once in __init__ (self.<name> = {prim.__name__}"
                                            "()) to have it captured"})
            _inline_cache[cls] = items
        found.extend(items)
    return found


def note_stale_bindings(runtime, targets: list, models, aliases=(), found=None):
    """Scan for the gaps of :func:`stale_bindings` and list them in the open step's ``coverage.json``
    (``not_captured``) through ``runtime`` (:meth:`~msprobe.engine.runtime.Runtime.add_note`).

    ``found``: the list an earlier scan returned, listed again without scanning (``None``: scan).
    Returns the list listed, or ``None`` when the scan failed (a WARNING; nothing listed)."""
    if found is None:
        try:
            found = stale_bindings(targets, models, aliases)
        except Exception as exc:  # a coverage scan must never break start()
            logger.warning("msprobe: coverage scan failed: %r", exc)
            return None
    for item in found:
        if runtime.first_time(("not captured", item["module"], item["name"])):
            logger.warning("msprobe: not captured: %s", item["reason"])
    runtime.add_note("not_captured", found)
    return found
