"""What watch mode keeps in memory: the journal lines of the open step, whole, and the last ``limit``
entries of the steps before it (README "Watch mode").

Lines are kept as the encoded text of the flushed batch they came in (one ``bytes`` object per batch,
shared by its lines, newline-terminated JSON as :func:`msprobe.format.journal.encode_json` writes
it), each line as ``(batch number, line index, text)``: no per-record Python containers live across
steps (the garbage collector never walks them), and a batch is split into lines and decoded only
when the history is written.

Memory: at most ``limit`` entries of earlier steps (the oldest dropped whole, a batch's text freed
with its last line), and the open step up to :data:`STEP_BYTES` of encoded text (beyond it its oldest
entries go, counted in :attr:`History.step_dropped`: only a run that never ends a step gets there).
"""
from __future__ import annotations

import collections

from msprobe.format import journal

#: encoded journal text of the open step kept whole beside the earlier steps' entries; a step that
#: outgrows it (a run that never calls ``step()``) keeps its latest entries only
STEP_BYTES = 64 << 20


class History:
    """The lines of the open step and of the last ``limit`` entries before it.

    Args:
        limit: entries of earlier steps kept (``watch.history``).

    ``len(history)`` is the number of entries of earlier steps kept that ``dump.json`` holds (at
    most ``limit``); lines of other names (a backward entry's construct edge made at its forward
    call before it received a gradient) ride along with no count, and go first when a step is cut.
    """

    def __init__(self, limit: int):
        self.limit = limit
        #: finished steps, oldest first: each ``(entries, with_data)``, an ordered map of entry key
        #: ``(step, directory, name)`` -> ``[(batch, index, text)]`` and the keys of those entries
        #: that ``dump.json`` holds (:func:`has_data`)
        self._earlier: collections.deque = collections.deque()
        self._size = 0                   # entries with data in ``_earlier`` (what ``limit`` counts)
        #: the open step's entries, in the same form, in the order of their first data line (entries
        #: without one yet first, in the order they appeared): the order of ``dump.json``
        self.current: collections.OrderedDict = collections.OrderedDict()
        self._step = None                # the open step's number
        self._batches: collections.deque = collections.deque()  # (batch, bytes) of the open step
        self._step_bytes = 0
        #: entries of the open step dropped because it outgrew :data:`STEP_BYTES`
        self.step_dropped = 0
        self._batch = 0                  # number of the latest batch kept
        #: stack id -> frames, from the stack-frames lines seen (definitions are never dropped)
        self.stack_frames: dict = {}
        #: entries seen (the heartbeat's ``records_seen``)
        self.entries_seen = 0
        self._counted: set = set()       # (directory, name) counted in the open step (:meth:`count`)
        self._with_data: set = set()     # keys of the open step's entries with a data line (:func:`has_data`)
        #: (step, directory) -> entries with data that directory had when its step ended, for the
        #: earlier steps still kept (so a written step can say whether it is whole or only its tail);
        #: the open step's are counted as they come
        self.step_totals: dict = {}

    def __len__(self) -> int:
        return self._size

    def keep(self, step: int, directory: str, lines: list, text: bytes) -> None:
        """Keep one flushed batch of step ``step``: ``lines`` its journal lines (resolved dicts, in
        journal order), ``text`` their encoding, one newline-terminated line each (``bytes``).

        A batch of a new step first ends the open one (:meth:`end_step`)."""
        if step != self._step:
            self.end_step()
            self._step = step
        self._batch += 1
        batch, current, entry_of, with_data = self._batch, self.current, journal.entry_of, self._with_data
        totals, where = self.step_totals, (step, directory)
        for i, line in enumerate(lines):
            name, data = entry_of(line)
            if name is None:
                definition = journal.stack_definition(line)
                if definition is not None:
                    self.stack_frames[definition[0]] = definition[1]
                continue
            key = (step, directory, name)
            got = current.get(key)
            if got is None:
                got = current[key] = []
                self.entries_seen += 1
            if data and key not in with_data:
                with_data.add(key)
                current.move_to_end(key)  # an entry's place in dump.json is its first data line
                totals[where] = totals.get(where, 0) + 1
            got.append((batch, i, text))
        self._batches.append((batch, len(text)))
        self._step_bytes += len(text)

    def count(self, step: int, directory: str, lines: list) -> None:
        """Count the new entries of a batch without keeping it (after the history was written,
        once per run, nothing kept would be written again)."""
        if step != self._step:
            self.end_step()
            self._step, self._counted = step, set()
        counted, subject = self._counted, journal.subject
        for line in lines:
            name = subject(line)
            if name is not None and (directory, name) not in counted:
                counted.add((directory, name))
                self.entries_seen += 1

    def bound_step(self) -> None:
        """Drop the open step's oldest entries while its batches exceed :data:`STEP_BYTES` (called
        after a batch without an anomaly: a batch that has one is written whole). A batch's bytes
        count until no kept entry has a line in it."""
        current, batches = self.current, self._batches
        while self._step_bytes > STEP_BYTES and len(current) > 1:
            key, _ = current.popitem(last=False)
            self.step_dropped += 1
            if key in self._with_data:  # no longer among the entries its step has
                self.step_totals[key[:2]] -= 1
            # entries are dropped in the order they first appeared: every batch before the first
            # line of the oldest kept entry holds lines of dropped entries only
            oldest = next(iter(current.values()))[0][0]
            while batches and batches[0][0] < oldest:
                self._step_bytes -= batches.popleft()[1]

    def end_step(self) -> None:
        """The open step's entries become earlier ones: at most ``limit`` of those stay."""
        if self.current:  # step_totals counted its entries with data as they came (keep)
            with_data = self._with_data
            self._earlier.append((self.current, with_data))
            self._size += len(with_data)
            self.current = collections.OrderedDict()
        earlier = self._earlier
        while self._size > self.limit:
            oldest, data = earlier[0]
            if len(data) <= self._size - self.limit:  # the whole step goes
                earlier.popleft()
                self._size -= len(data)
                for step, directory, _ in oldest:
                    self.step_totals.pop((step, directory), None)
            else:  # its first entries go (those without data first: they come first)
                key, _ = oldest.popitem(last=False)
                if key in data:
                    data.discard(key)
                    self._size -= 1
        self._step, self._step_bytes, self.step_dropped = None, 0, 0
        self._batches.clear()
        self._counted = set()
        self._with_data = set()

    def clear(self) -> None:
        """Forget every kept line (they were written)."""
        self._earlier.clear()
        self.step_totals.clear()
        self._size = 0
        self.current = collections.OrderedDict()
        self._step, self._step_bytes = None, 0
        self._batches.clear()
        self._with_data = set()

    def _kept(self):
        """``(key, items)`` of every entry kept, oldest step first (the open step last)."""
        for entries, _ in self._earlier:
            yield from entries.items()
        yield from self.current.items()

    def lines_of(self, name: str) -> list:
        """The kept journal lines (dicts) of the entries named ``name`` (any step), oldest first."""
        decode = _Decoder()
        return [decode(item) for key, items in self._kept() if key[2] == name for item in items]

    def by_step(self) -> list:
        """``[(step, directory, lines)]`` of what is kept, by step, each step's lines (dicts) in the
        order they were journaled (execution order: a backward entry after every forward before it,
        although its construct.json line was made with its forward call)."""
        groups: dict = {}
        for (step, directory, _), items in self._kept():
            groups.setdefault((step, directory), []).extend(items)
        decode = _Decoder()
        return [(step, d, [decode(item) for item in sorted(items, key=_order)])
                for (step, d), items in groups.items()]


#: journal line kinds that set data of an entry (a stack use sets data when it has a body)
_DATA_KINDS = frozenset(("set_key", "set_item", "set_entry", "set_path"))


def has_data(line: dict) -> bool:
    """Whether a journal line sets data of its entry, so that the entry is in ``dump.json`` (an
    entry with only construct edges or stack uses is not: :meth:`msprobe.format.journal.Replay.result`)."""
    kind = journal.line_kind(line)
    return kind in _DATA_KINDS or (kind == "stack_ref" and bool(line.get("v")))


def data_entries(lines) -> int:
    """How many entries of ``lines`` (journal dicts) ``dump.json`` holds (:func:`has_data`)."""
    return len({line["e"] for line in lines if has_data(line)})


def _order(item: tuple) -> tuple:
    return item[0], item[1]


class _Decoder:
    """Decodes kept lines ``(batch, index, text)``, splitting each batch's text once."""

    def __init__(self):
        self._offsets: dict = {}

    def __call__(self, item: tuple) -> dict:
        batch, i, text = item
        offsets = self._offsets.get(batch)
        if offsets is None:
            offsets = self._offsets[batch] = split_lines(text, text.count(b"\n"))[1]
        return journal.decode_line(text[offsets[i]:offsets[i + 1]])


def check_lines(text: bytes, count: int) -> None:
    """Raise ``ValueError`` unless ``text`` is ``count`` newline-terminated lines (the encoders write
    one line per record; JSON has no raw newline inside a line)."""
    if text.count(b"\n") != count or (count and not text.endswith(b"\n")) or (not count and text):
        raise ValueError(f"an encoded batch of {count} journal lines is not one line each")


def split_lines(text, count: int) -> tuple:
    """``(text, offsets)``: ``text`` as ``bytes`` and where each of its ``count`` lines starts (line
    ``i`` is ``text[offsets[i]:offsets[i + 1]]``).

    Raises:
        ValueError: ``text`` is not ``count`` newline-terminated lines."""
    text = bytes(text)
    check_lines(text, count)
    offsets, pos, find = [0], 0, text.find
    for _ in range(count):
        pos = find(b"\n", pos) + 1
        offsets.append(pos)
    return text, offsets
