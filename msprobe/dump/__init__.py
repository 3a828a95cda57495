"""Reading dumps back: ``load(step_rank_dir)`` and ``summarize(dump_path)``."""
from msprobe.core.reader import StepDump, iter_step_dirs, load, summarize

__all__ = ["load", "summarize", "iter_step_dirs", "StepDump"]
