"""Import stand-in for ``hyper_parallel`` (a mindformers 2.0.0 requirement that is not on the package
registry). Every attribute of this package and of any of its sub-modules is a do-nothing class, which
is all that mindformers' LLaMA code needs at import time; the parallel features are never used.
"""
import importlib.abc
import importlib.machinery
import sys
import types

_CLASSES: dict = {}


def _nothing_class(qualname: str):
    cls = _CLASSES.get(qualname)
    if cls is None:
        def __init__(self, *args, **kwargs):
            pass

        def __call__(self, *args, **kwargs):
            return None

        cls = type(qualname.rsplit(".", 1)[-1], (), {"__init__": __init__, "__call__": __call__,
                                                     "__module__": qualname.rsplit(".", 1)[0]})
        _CLASSES[qualname] = cls
    return cls


def _module_getattr(module_name: str):
    def __getattr__(name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _nothing_class(f"{module_name}.{name}")
    return __getattr__


class _StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname.startswith(__name__ + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = _module_getattr(spec.name)
        return module

    def exec_module(self, module):
        pass


__getattr__ = _module_getattr(__name__)
sys.meta_path.append(_StandInFinder())
