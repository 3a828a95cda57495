"""What ``TARGET`` and ``GOLDEN`` may be, and how their step/rank directories are paired.

Each side is a ``dump.json`` (or ``debug.json``) file, a step/rank directory, a step directory
(``step{N}``, holding ``rank{R}``/``proc{pid}``) or a whole ``dump_path`` (with its ``pynative/`` and
``graph/`` subtrees, each paired with the same subtree of the other side; a single subtree is paired
with a side that has steps at its top). Steps are paired by number;
within a step, ranks by rank number, or, when a side has one directory per step (``proc{pid}``
from a single process), that one with the other side's one.
"""
from __future__ import annotations

import os
import re
from typing import List, NamedTuple, Optional, Sequence, Tuple

from msprobe.dump import ANOMALIES, JOURNAL, SUBTREES
from msprobe.dump import iter_step_dirs

_STEP = re.compile(r"^step(\d+)$")
_RANK = re.compile(r"^rank(\d*)$")


class InputError(ValueError):
    """A compare input that is not a dump, or two inputs that cannot be paired (message says why)."""


class StepRank(NamedTuple):
    step: Optional[int]
    rank: str                # directory name: rank0, rank, proc1234
    path: str
    tree: str = ""           # "pynative" / "graph" for those subtrees of a dump_path


class PairedDirs(NamedTuple):
    step: Optional[int]
    rank: str                # the target's rank directory name: rank0, rank, proc1234
    target: str
    golden: str
    tree: str = ""           # "pynative" / "graph": the subtree both directories are in

    @property
    def label(self) -> str:
        """How results name the pair's rank: ``rank0``, ``pynative_rank0`` in a subtree."""
        return f"{self.tree}_{self.rank}" if self.tree else self.rank


def _is_rank_dir(path: str) -> bool:
    return any(os.path.exists(os.path.join(path, f)) for f in ("dump.json", "debug.json", JOURNAL))


def resolve(path: str) -> List[StepRank]:
    """The step/rank directories ``path`` stands for, by step then rank.

    Raises:
        InputError: ``path`` does not exist or holds no dump.
    """
    if not os.path.exists(path):
        raise InputError(f"{path}: no such file or directory")
    if os.path.isfile(path):
        if os.path.basename(path) not in ("dump.json", "debug.json"):
            raise InputError(f"{path}: expected a dump.json or debug.json file, or a dump directory")
        path = os.path.dirname(os.path.abspath(path))
    path = os.path.abspath(path)
    if _is_rank_dir(path):
        parent = _STEP.match(os.path.basename(os.path.dirname(path)))
        return [StepRank(int(parent.group(1)) if parent else None, os.path.basename(path), path)]
    step = _STEP.match(os.path.basename(path))
    if step:
        found = [StepRank(int(step.group(1)), name, os.path.join(path, name))
                 for name in sorted(os.listdir(path)) if _is_rank_dir(os.path.join(path, name))]
    else:
        found = [StepRank(s, r, p) for s, r, p in iter_step_dirs(path) if _is_rank_dir(p)]
        for tree in SUBTREES:  # PyNative networks with mindspore.jit Cells write both subtrees
            found += [StepRank(s, r, p, tree) for s, r, p in iter_step_dirs(os.path.join(path, tree))
                      if _is_rank_dir(p)]
    if not found:
        raise InputError(f"{path}: no dump found (expected dump.json, a step{{N}} directory with "
                         f"rank{{R}}/proc{{pid}} directories, or a dump_path with step{{N}} directories)")
    return found


def anomaly_first(items: Sequence[StepRank]) -> List[StepRank]:
    """``items`` with those holding ``anomalies.json`` (a non-finite value was recorded there; in
    watch mode, the anomaly's step) first, each group in its given order."""
    bad = [item for item in items if os.path.isfile(os.path.join(item.path, ANOMALIES))]
    return bad + [item for item in items if item not in bad]


def rank_number(name: str) -> Optional[int]:
    """``3`` for ``rank3``, ``0`` for ``rank``, None for ``proc{pid}``."""
    m = _RANK.match(name)
    return int(m.group(1) or 0) if m else None


def pair(target: str, golden: str, steps: Optional[Sequence[int]] = None,
         ranks: Optional[Sequence[int]] = None) -> List[PairedDirs]:
    """Pair the step/rank directories of two inputs (see the module docstring).

    Args:
        steps: only these step numbers (None: all steps present on both sides).
        ranks: only these rank numbers (``rank{R}`` directories; None: all).

    Raises:
        InputError: an input is not a dump, nothing is left to compare, or a step's ranks cannot be
            paired (different rank sets).
    """
    t_all, g_all = _match_trees(resolve(target), resolve(golden), target, golden)
    if len(t_all) == 1 and len(g_all) == 1:  # two single directories: compare them whatever their names
        (t,), (g,) = t_all, g_all
        return [PairedDirs(t.step, t.rank, t.path, g.path)]
    out = []
    by_step = {}
    for side, items in ((0, t_all), (1, g_all)):
        for item in items:
            by_step.setdefault((item.tree, item.step), ([], []))[side].append(item)
    for tree, step in sorted(by_step, key=lambda k: (k[0], -1 if k[1] is None else k[1])):
        if steps is not None and step not in steps:
            continue
        t_items, g_items = by_step[tree, step]
        if not t_items or not g_items:
            continue
        for p in _pair_ranks(step, t_items, g_items, ranks):
            out.append(p._replace(tree=tree))
    if not out:
        raise InputError(f"nothing to compare: {_asked_steps(steps, ranks)} present in both {target} "
                         f"and {golden}")
    return out


def _numbers(word: str, values) -> str:
    """``"step 3"`` / ``"steps 3, 4"`` for ``word`` and the numbers ``values`` (sorted)."""
    values = sorted(values)
    return f"{word}{'' if len(values) == 1 else 's'} {', '.join(map(str, values))}"


def _asked_steps(steps, ranks) -> str:
    """The subject of "... present in both" for the steps and ranks asked for (``None``: any), with
    its verb: ``"no step is"``, ``"step 3 is not"``, ``"none of steps 3, 4 with rank 0 is"``."""
    rank = "" if ranks is None else " with " + _numbers("rank", ranks)
    if steps is None:
        return f"no step{rank} is"
    if len(set(steps)) == 1:
        return f"{_numbers('step', set(steps))}{rank} is not"
    return f"none of {_numbers('step', set(steps))}{rank} is"


class UnpairedSteps(NamedTuple):
    """The steps of two inputs that :func:`pair` leaves out because one input holds them only
    (:func:`find_unpaired`). Each step is a ``(tree, step)`` pair, ``tree`` ``""`` for the steps at a
    ``dump_path``'s top, ``"pynative"``/``"graph"`` for those of its subtrees; sorted."""

    target_only: Tuple[Tuple[str, int], ...] = ()
    golden_only: Tuple[Tuple[str, int], ...] = ()
    both: Tuple[Tuple[str, int], ...] = ()     # the steps compared

    def text(self) -> Optional[str]:
        """The note the console shows: ``"only steps 0, 1, 2 are compared: step 3 is in the golden
        dump only"``; None when no step is on one side only."""
        alone = [(name, keys) for name, keys in (("target", self.target_only), ("golden", self.golden_only))
                 if keys]
        if not alone:
            return None

        def named(keys):
            return f"step{'s' * (len(keys) > 1)} " + ", ".join(f"{n} ({tree}/)" if tree else str(n)
                                                            for tree, n in keys)

        said = [f"{named(keys)} {'are' if len(keys) > 1 else 'is'} in the {name} dump only" for name, keys in alone]
        both = self.both
        head = f"only {named(both)} {'are' if len(both) > 1 else 'is'} compared" if both else "no step is compared"
        return f"{head}: {'; '.join(said)}"

    def to_dict(self) -> dict:
        """What the JSON outputs (``compare``'s summary, ``first-diff --json``) hold as
        ``unpaired_steps``: ``{"target_only": [3], "golden_only": []}``, step numbers in ascending
        order (empty lists when every step is on both sides); when the inputs hold ``pynative/``
        and ``graph/`` subtrees, these lists name a step left out in any subtree, and ``by_tree``
        gives them per subtree: ``{"graph": {"target_only": [3], "golden_only": []}, ...}``."""
        out = {"target_only": sorted({n for _, n in self.target_only}),
               "golden_only": sorted({n for _, n in self.golden_only})}
        trees = sorted({tree for tree, _ in self.target_only + self.golden_only + self.both if tree})
        if trees:
            out["by_tree"] = {tree: {side: [n for t, n in keys if t == tree]
                                     for side, keys in (("target_only", self.target_only),
                                                        ("golden_only", self.golden_only))}
                              for tree in trees}
        return out


def find_unpaired(target: str, golden: str, steps: Optional[Sequence[int]] = None) -> UnpairedSteps:
    """The steps present in one of two inputs only (of ``steps``, when given), which :func:`pair`
    leaves out; none when the inputs are two single directories (compared whatever their steps).

    Raises:
        InputError: as :func:`pair`.
    """
    sides = _match_trees(resolve(target), resolve(golden), target, golden)
    if all(len(items) == 1 for items in sides):
        return UnpairedSteps()
    found = [{(i.tree, i.step) for i in items if i.step is not None and (steps is None or i.step in steps)}
             for items in sides]
    return UnpairedSteps(tuple(sorted(found[0] - found[1])), tuple(sorted(found[1] - found[0])),
                         tuple(sorted(found[0] & found[1])))


def unpaired_steps(target: str, golden: str, steps: Optional[Sequence[int]] = None) -> Optional[str]:
    """A note naming the steps present in one of two inputs only, which :func:`pair` leaves out:
    ``"only steps 0, 1, 2 are compared: step 3 is in the golden dump only"``; None when every step
    (of ``steps``, when given) is on both sides, or when the inputs are two single directories
    (:meth:`UnpairedSteps.text` of :func:`find_unpaired`; :meth:`UnpairedSteps.to_dict` gives the
    step numbers).

    Raises:
        InputError: as :func:`pair`.
    """
    return find_unpaired(target, golden, steps).text()


def _match_trees(t_all: List[StepRank], g_all: List[StepRank], target: str, golden: str):
    """``(t_all, g_all)``, where a side holding one ``pynative/`` or ``graph/`` subtree and no step at
    its top, against a side holding steps at its top only, has that subtree's steps paired with them.

    Raises:
        InputError: such a side holds both subtrees (which of them matches the other side is not
            known); the message names the subtree paths to pass instead.
    """
    trees = [{item.tree for item in items} for items in (t_all, g_all)]
    if trees[0] & trees[1] or {""} not in trees:
        return t_all, g_all
    side, path = (0, target) if trees[1] == {""} else (1, golden)
    if len(trees[side]) > 1:
        other = golden if side == 0 else target
        raise InputError(f"{path} holds the subtrees {' and '.join(f'{t}/' for t in sorted(trees[side]))} "
                         f"(a PyNative run with mindspore.jit functions), {other} holds step directories "
                         f"at its top: pass one subtree instead: "
                         f"{' or '.join(os.path.join(path, t) for t in sorted(trees[side]))}")
    plain = [[item._replace(tree="") for item in items] for items in (t_all, g_all)]
    return plain[0], plain[1]


def _pair_ranks(step, t_items, g_items, ranks) -> List[PairedDirs]:
    if len(t_items) == 1 and len(g_items) == 1 and ranks is None:
        return [PairedDirs(step, t_items[0].rank, t_items[0].path, g_items[0].path)]
    t_num = {rank_number(i.rank): i for i in t_items}
    g_num = {rank_number(i.rank): i for i in g_items}
    if None in t_num or None in g_num:
        raise InputError(f"step {step}: several proc{{pid}} directories on a side cannot be paired; "
                         f"pass two step/rank directories instead")
    if set(t_num) != set(g_num) and ranks is None:
        raise InputError(f"step {step}: ranks differ: target {sorted(t_num)}, golden {sorted(g_num)} "
                         f"(choose with --rank)")
    chosen = sorted(set(t_num) & set(g_num))
    if ranks is not None:
        chosen = [r for r in chosen if r in ranks]
    return [PairedDirs(step, t_num[r].rank, t_num[r].path, g_num[r].path) for r in chosen]
