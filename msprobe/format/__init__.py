"""The dump's on-disk contract, versioned (``msprobe-mindspore/1``): JSON Schemas of every file the
tool writes and their validation. Human-readable description: ``docs/FORMAT.md``."""
from msprobe.format.validate import (SCHEMA_VERSION, FormatError, check_tensor_files, is_step_dir, schema,
                                     validate_document, validate_dump_tree, validate_file)

__all__ = ["SCHEMA_VERSION", "FormatError", "check_tensor_files", "is_step_dir", "schema",
           "validate_document", "validate_dump_tree", "validate_file"]
