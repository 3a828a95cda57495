"""Reading dumps back: ``load(step_rank_dir)``, ``iter_entries(step_rank_dir)`` and ``summarize(dump_path)``."""
from msprobe.core.reader import DumpFormatError, Piece, StepDump, iter_entries, iter_step_dirs, load, summarize

__all__ = ["load", "summarize", "iter_step_dirs", "iter_entries", "Piece", "StepDump", "DumpFormatError"]
