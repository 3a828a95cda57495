"""Coverage gaps the dump cannot close itself, made visible (case B08).

L1 capture replaces module attributes (``mindspore.ops.relu``) while the dump runs. A name bound
*before* ``start()`` — ``from mindspore.ops import relu`` at the top of a script — still points to
MindSpore's own function, so calls through it are not recorded. They cannot be detected per call;
instead, at ``start()`` the user's modules are scanned for such *stale bindings*: the ``__main__``
module and the modules defining the model's Cell classes (MindSpore's and msprobe's own modules
excluded). Each one found is logged once as a WARNING and listed in the step's ``coverage.json``
under ``not_captured``, with the module, the name and how to call it so that it is captured.
"""
from __future__ import annotations

import logging
import sys

logger = logging.getLogger("msprobe")

_SKIP_PREFIXES = ("mindspore", "msprobe", "numpy", "builtins")
_warned: set = set()
_originals_cache: dict = {}


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


def _user_modules(models) -> list:
    names = {"__main__"}
    for _, root in models or ():
        for _, cell in root.cells_and_names():
            names.add(type(cell).__module__)
    modules = []
    for name in sorted(names):
        if name is None or name.split(".", 1)[0] in _SKIP_PREFIXES:
            continue
        module = sys.modules.get(name)
        if module is not None:
            modules.append(module)
    return modules


def stale_bindings(targets: list, models) -> list:
    """Names in the user's modules bound to the original of a wrapped API (call before wrapping).

    Returns a list of ``{"name", "module", "api", "call_as", "reason"}`` dicts.
    """
    originals = _originals(targets)
    found = []
    for module in _user_modules(models):
        for name, value in list(vars(module).items()):
            hit = originals.get(id(value))
            if hit is None or hit[0] is not value:
                continue
            _, api, qualified = hit
            found.append({"name": name, "module": module.__name__, "api": api, "call_as": qualified,
                          "reason": f"'{name}' in module {module.__name__} was bound to {qualified} "
                                    f"before start(): its calls are not recorded as {api}; call it "
                                    f"as {qualified} (module attribute) to have it captured"})
    for item in found:
        key = (item["module"], item["name"])
        if key not in _warned:
            _warned.add(key)
            logger.warning("msprobe: not captured: %s", item["reason"])
    return found


def note_stale_bindings(writer, targets: list, models) -> None:
    """Scan for stale bindings and list them in ``writer``'s ``coverage.json`` (``not_captured``)."""
    try:
        found = stale_bindings(targets, models)
    except Exception as exc:  # a coverage scan must never break start()
        logger.warning("msprobe: coverage scan failed: %r", exc)
        return
    if found and writer is not None:
        writer.add_note("not_captured", found)
