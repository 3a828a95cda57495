"""Example networks for msprobe (importable as ``examples.models`` from the repository root)."""
