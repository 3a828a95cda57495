"""The tool's version: one definition, read by ``pyproject.toml`` (setuptools ``attr:``), exported as
``msprobe.__version__`` and written into every dump file with a top-level object
(:mod:`msprobe.format.journal`)."""

__version__ = "0.1.0"
