"""Reading dumps back: ``load(step_rank_dir)``, ``iter_entries(step_rank_dir)``, ``summarize(dump_path)``;
L2 kernel dumps: ``iter_kernel_steps(dump_path)``, ``load_kernel_statistics(step_dir)``."""
from msprobe.core.reader import (DumpFormatError, Piece, StepDump, iter_entries, iter_kernel_steps,
                                 iter_step_dirs, load, load_kernel_statistics, summarize)

__all__ = ["load", "summarize", "iter_step_dirs", "iter_entries", "iter_kernel_steps",
           "load_kernel_statistics", "Piece", "StepDump", "DumpFormatError"]
