"""Reading dumps back: ``load(step_rank_dir)``, ``iter_entries(step_rank_dir)``,
``iter_bodies(step_rank_dir)`` (streamed ``(entry, body)``),
``load_stacks(step_rank_dir)``, ``load_construct(step_rank_dir)``, ``summarize(dump_path)``,
``read_report(step_rank_dir, ANOMALIES)`` (``anomalies.json``/``coverage.json``, either format version);
L2 kernel dumps: ``iter_kernel_steps(dump_path)``, ``load_kernel_statistics(step_dir)``; a tensor file:
``load_npy(path)`` (bfloat16 files too); ``JOURNAL`` (the journal's file name), ``ANOMALIES`` (the
file a step/rank directory holds when it has a non-finite value), ``SUBTREES``
(``pynative``/``graph``). Analysis code reads dumps through this module only."""
from msprobe.read.reader import (SUBTREES, DumpFormatError, Piece, StepDump, iter_bodies, iter_entries,
                                 iter_kernel_steps, iter_step_dirs, load, load_construct,
                                 load_kernel_statistics, load_stacks, summarize)
from msprobe.read.report import ANOMALIES, read_report
from msprobe.format.journal import JOURNAL


def load_npy(path: str):
    """A tensor file of a dump as a numpy array (``.npy``; bfloat16 files written as ``<E2``, such as
    MindSpore's own kernel dump writes, are decoded to float32). Raises ``OSError``/``ValueError``
    for a missing or malformed file."""
    from msprobe.format.npy import load_npy as load

    return load(path)

__all__ = ["load", "summarize", "iter_step_dirs", "iter_entries", "iter_bodies", "iter_kernel_steps",
           "load_kernel_statistics", "load_stacks", "load_construct", "Piece", "StepDump", "DumpFormatError",
           "load_npy", "JOURNAL", "ANOMALIES", "SUBTREES", "read_report"]
