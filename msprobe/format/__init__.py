"""The dump's on-disk contract, versioned (``msprobe-mindspore/2``; version 1 is still read): JSON
Schemas of every file the tool writes and their validation. Human-readable description: ``docs/FORMAT.md``.

The validation names below are imported on first use, so writing a dump (which needs only
:mod:`msprobe.format.journal`, :mod:`msprobe.format.naming`, :mod:`msprobe.format.npy`) does not load
``jsonschema``."""

__all__ = ["SCHEMA_VERSION", "FormatError", "check_tensor_files", "is_step_dir", "schema",
           "validate_document", "validate_dump_tree", "validate_file"]


def __getattr__(name: str):
    if name in __all__:
        from msprobe.format import validate

        return getattr(validate, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
