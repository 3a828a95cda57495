"""Step directories: where a step's files go, and what happens to what an earlier run left there.

* A step of rank ``R`` is written to ``{dump_path}/step{N}/rank{R}``. The rank is
  :func:`current_rank`: MindSpore's communication rank once ``mindspore.communication.init()`` has
  run, else unknown, and the step is written to ``{dump_path}/step{N}/proc{pid}`` until it is known
  (the runtime renames it to ``rank{R}`` then: records made before ``init()`` exist).
* A directory an earlier run left is never overwritten: :func:`move_aside` renames it to
  ``{directory}.previous-{YYYYmmdd-HHMMSS}``; ``proc{pid}`` directories of processes that no longer
  run are earlier runs too (:func:`clear_for`); so are the files at the top of ``dump_path`` that one
  process of a run writes (watch mode's heartbeat, :func:`clear_file_for`).

The functions here hold no state: the :class:`msprobe.engine.runtime.Runtime` keeps the rank of the
open step and the ``start(rank_id=...)`` override.
"""
from __future__ import annotations

import logging
import os
import re
import time

logger = logging.getLogger("msprobe")

_PROC_DIR = re.compile(r"^proc(\d+)$")


def current_rank() -> int | None:
    """MindSpore's communication rank (``mindspore.communication.get_rank()``) when communication is
    initialised (``GlobalComm.INITED``), else ``None`` (a single process, or ``init()`` not called
    yet). The one rank lookup of the package."""
    try:
        from mindspore.communication import GlobalComm, get_rank

        if GlobalComm.INITED:
            return int(get_rank())
    except Exception:  # communication unavailable: a single process
        pass
    return None


def launch_rank() -> int:
    """The rank for a decision that cannot wait for ``init()`` (level L2: MindSpore's native dump
    is configured before the first graph compiles, often before ``init()``): :func:`current_rank`
    when known, else the launcher's ``RANK_ID`` (or ``RANK``) environment variable — msrun sets it,
    and ``init()`` gives the process that rank —, else 0."""
    rank = current_rank()
    if rank is not None:
        return rank
    for var in ("RANK_ID", "RANK"):
        value = os.environ.get(var)
        if value is not None and value.strip().isdigit():
            return int(value)
    return 0


def rank_dir_name(rank: int | None) -> str:
    """``rank{R}``, or ``proc{pid}`` (this process) while the rank is unknown (``None``)."""
    return f"rank{rank}" if rank is not None else f"proc{os.getpid()}"


def step_directory(dump_path: str, step: int, rank: int | None) -> str:
    """``{dump_path}/step{step}/`` + :func:`rank_dir_name`."""
    return os.path.join(dump_path, f"step{step}", rank_dir_name(rank))


class Moves:
    """What one run moved aside (:func:`move_aside`): the first move is said at once in a WARNING,
    later ones at INFO only, and :meth:`summary` counts them all in one line at the end of the run
    (a rerun into the same ``dump_path`` moves one directory per step, and in watch mode the
    earlier run's heartbeat file)."""

    def __init__(self):
        self.count = 0
        self.files = 0                    # of ``count``: files (watch heartbeats), not directories
        self.first: tuple | None = None   # (path, its new name, whether it is a file)

    def moved(self, path: str, target: str, is_file: bool = False) -> bool:
        """Count a move (of a file when ``is_file``); True when it is the run's first (said in a
        WARNING)."""
        self.count += 1
        self.files += is_file
        if self.first is None:
            self.first = (path, target, is_file)
            return True
        return False

    def summary(self) -> str | None:
        """One line when the run moved more than one directory or file aside, else None."""
        if self.count < 2:
            return None
        path, target, is_file = self.first
        dirs = self.count - self.files
        what = " and ".join(f"{n} {word if n == 1 else word_s}" for n, word, word_s in
                            ((dirs, "directory", "directories"), (self.files, "file", "files")) if n)
        return (f"msprobe: this run moved {what} an earlier run left aside, each to "
                f"{{name}}.previous-{{time}} beside it (the first: {path} to {target}; "
                f"under {os.path.dirname(path) if is_file else os.path.dirname(os.path.dirname(path))})")


def clear_for(directory: str, rank: int | None, moves: Moves | None = None) -> None:
    """Make room for a step directory this run is about to write (or rename a step to): an earlier
    run's ``directory`` is moved aside (:func:`move_aside`); while the rank is unknown, so are the
    ``proc{pid}`` siblings of processes that no longer run (each run has a new pid, so their names
    never collide: they are earlier runs of a process without a rank, moved aside so readers do not
    mix runs). A ``proc{pid}`` of a process that runs (another process, or a reused pid) is left.
    ``moves``: the run's :class:`Moves` (only its first move is a WARNING), or None (each is).

    Raises:
        OSError: a rename failed.
    """
    move_aside(directory, moves=moves)
    if rank is None:
        _move_aside_dead_procs(os.path.dirname(directory), directory, moves)


def clear_file_for(path: str, proc_name: re.Pattern, what: str, moves: Moves | None = None) -> None:
    """:func:`clear_for` for a file this run is about to write (a watch heartbeat at the top of
    ``dump_path``): an earlier run's file at ``path`` is moved aside, and so are the files beside it
    whose name matches ``proc_name`` (group 1: a pid) of processes that no longer run. ``what``
    names the file in the WARNING (``"the watch heartbeat"``).

    Raises:
        OSError: a rename failed.
    """
    move_aside(path, moves=moves, what=what)
    _move_aside_dead_procs(os.path.dirname(path), path, moves, proc_name, what)


def _move_aside_dead_procs(parent: str, writes: str, moves: Moves | None, proc_name: re.Pattern = _PROC_DIR,
                           what: str | None = None) -> None:
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        m = proc_name.match(name)
        if m and int(m.group(1)) != os.getpid() and not _pid_alive(int(m.group(1))):
            move_aside(os.path.join(parent, name), writes, f"process {m.group(1)} no longer runs", moves, what)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by someone else
        return True
    return True


def move_aside(directory: str, writes: str | None = None, why: str = "", moves: Moves | None = None,
               what: str | None = None) -> str | None:
    """Never overwrite silently: a non-empty ``directory`` left by an earlier run is renamed to
    ``{directory}.previous-{YYYYmmdd-HHMMSS}`` (``-{k}`` appended when that exists too), with a
    WARNING naming both paths and ``writes``, the directory this run writes (default ``directory``
    itself), so readers (``iter_step_dirs``, compare tools) find the newest run. When ``writes`` is
    another directory (a sibling ``proc{pid}`` of a process that no longer runs, ``why`` saying so),
    the WARNING says that nothing would have been overwritten: it is moved so that readers of the
    step directory do not mix it with this run. With ``moves`` (the run's :class:`Moves`), only the
    run's first move is a WARNING; later ones are logged at INFO and counted. With ``what`` (e.g.
    ``"the watch heartbeat"``), ``directory`` is a file so named in the WARNING, moved when it exists.

    Returns:
        The new name, ``None`` when there was nothing to move (also when another process moved it
        first).

    Raises:
        OSError: the rename failed.
    """
    if what is None:
        try:
            if not os.listdir(directory):
                return None
        except (FileNotFoundError, NotADirectoryError):
            return None
    elif not os.path.isfile(directory):
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target, n = f"{directory}.previous-{stamp}", 1
    while os.path.exists(target):
        target, n = f"{directory}.previous-{stamp}-{n}", n + 1
    try:
        os.rename(directory, target)
    except FileNotFoundError:  # another process (rank) of this run moved it first
        return None
    say = logger.warning if moves is None or moves.moved(directory, target, what is not None) else logger.info
    held = "holds a dump from an earlier run" if what is None else f"is {what} of an earlier run"
    if writes is None or writes == directory:
        say("msprobe: %s %s; it was moved to %s and this run writes %s", directory,
            "already " + held if what is None else held, target, directory)
    else:
        say("msprobe: %s %s (%s); nothing of it would be overwritten, but it was moved to %s so that "
            "readers of %s do not mix it with this run (this run writes %s)", directory, held,
            why or "another process", target, os.path.dirname(directory), writes)
    return target
