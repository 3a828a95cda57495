"""Reading dumps back: ``load(step_rank_dir)``, ``iter_entries(step_rank_dir)``,
``iter_bodies(step_rank_dir)`` (streamed ``(entry, body)``),
``load_stacks(step_rank_dir)``, ``load_construct(step_rank_dir)``, ``summarize(dump_path)``;
L2 kernel dumps: ``iter_kernel_steps(dump_path)``, ``load_kernel_statistics(step_dir)``."""
from msprobe.core.reader import (DumpFormatError, Piece, StepDump, iter_bodies, iter_entries,
                                 iter_kernel_steps,
                                 iter_step_dirs, load, load_construct, load_kernel_statistics,
                                 load_stacks, summarize)

__all__ = ["load", "summarize", "iter_step_dirs", "iter_entries", "iter_bodies", "iter_kernel_steps",
           "load_kernel_statistics", "load_stacks", "load_construct", "Piece", "StepDump", "DumpFormatError"]
