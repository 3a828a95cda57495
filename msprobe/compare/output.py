"""Writing compare results: ``compare_result_{rank}_{timestamp}.csv`` (rows streamed; the name in full:
:func:`result_name`), optional
``.xlsx`` (openpyxl, write-only mode) and ``compare_summary_{timestamp}.json``."""
from __future__ import annotations

import csv
import json
import math
from typing import Iterable, List, Optional

import orjson


def _cell(value):
    if value is None:
        return "N/A"
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def result_name(rank: str, timestamp: str, step: Optional[int] = None, tree: str = "") -> str:
    """``compare_result_{rank}[_{tree}][_step{step}]_{timestamp}``: ``rank`` the target's rank
    directory name (``rank0``, ``proc1234``), as the reference tool begins its per-rank result names
    (``compare_result_rank0_``); ``tree`` (``pynative``/``graph``) for a pair in a subtree; ``step``
    given when several steps are compared (None: left out)."""
    parts = [rank] + ([tree] if tree else []) + ([f"step{step}"] if step is not None else [])
    return "compare_result_" + "_".join(parts + [timestamp])


class ResultWriter:
    """Writes rows (lists in ``columns`` order) to ``{base}.csv`` and, with ``xlsx``, ``{base}.xlsx``;
    keeps per-result counts for the summary."""

    def __init__(self, base: str, columns: List[str], xlsx: bool = False):
        self.columns = columns
        self.csv_path = base + ".csv"
        self.xlsx_path = base + ".xlsx" if xlsx else None
        self.counts = {}
        self._f = open(self.csv_path, "w", newline="", encoding="utf-8")
        self._csv = csv.writer(self._f, lineterminator="\n")
        self._csv.writerow(columns)
        self._book = self._sheet = None
        if xlsx:
            from openpyxl import Workbook

            self._book = Workbook(write_only=True)
            self._sheet = self._book.create_sheet("compare")
            self._sheet.append(columns)

    def write(self, rows: Iterable[list]) -> None:
        """Write rows given as lists in ``columns`` order."""
        write = self._f.write
        counts = self.counts
        result_at = self.columns.index("Result")
        for row in rows:
            # None and non-finite floats need a text; a finite float f has f - f == 0
            values = ["N/A" if v is None else v if v.__class__ is not float or v - v == 0.0 else _cell(v)
                      for v in row]
            # orjson's JSON array of plain strings and numbers is a CSV line with every string quoted
            # (~5x faster than csv.writer on float-heavy rows); rows with characters JSON escapes
            # differently from CSV go through the csv module
            line = orjson.dumps(values)
            if b"\\" in line:
                self._csv.writerow(values)
            else:
                write(line[1:-1].decode() + "\n")
            if self._sheet is not None:
                self._sheet.append([_xlsx_cell(v) for v in values])
            result = row[result_at]
            counts[result] = counts.get(result, 0) + 1

    def close(self) -> None:
        self._f.close()
        if self._book is not None:
            self._book.save(self.xlsx_path)


def _xlsx_cell(value):
    if isinstance(value, str) and len(value) > 32000:  # Excel's cell limit is 32,767 characters
        return value[:32000] + "..."
    return value


def write_summary(path: str, summary: dict) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2, default=str, allow_nan=False)


def json_safe(value):
    """``value`` with non-finite floats replaced by the strings ``nan``/``inf``/``-inf``."""
    if isinstance(value, float) and not math.isfinite(value):
        return _cell(value)
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value
