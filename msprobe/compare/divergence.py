"""First difference of two runs (where they part) and first NaN/Inf producer of one run.

First difference: in execution order, forward entries first, then backward (and parameter
gradients), the first entry whose inputs agree and whose outputs do not (a backward entry's inputs
include its forward call's inputs). "Agree" is the ``pass``
result of the thresholds (``exact=True``: bitwise equal statistics/CRC, or arrays in tensor mode).
When that entry is a Cell, the first qualifying entry inside it (``construct.json``) is named
instead, innermost first, so a Cell is only blamed when none of its dumped children is; a Cell inside
it whose only differing inputs are its own Parameters (``parameters.*``) and whose outputs differ
qualifies too (``kind="input"``, "its parameters already differ"); at mix the first call directly
inside that Cell taking one of those Parameters as an input is named instead, the deepest entry where
the difference shows (:attr:`Finding.parameters_of`).

Within tolerance, an entry whose inputs pass but already differ by nearly as much as its outputs
(error gain at most ``entry.gain`` of ``thresholds.yaml``) does not produce the difference, it
carries one that stayed under the thresholds up to there: when such an entry comes first, the entry
the bitwise rule names among the entries up to it (for a Cell, up to the end of its call: the entries
inside it) is named instead (``Finding.exceeds_at`` names the carrying entry, the innermost one inside
that Cell). The Parameters of the Cells inside a Cell count as inputs of it for the gain
(:meth:`StepComparison.nested_parameter_errors`).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, Tuple

from msprobe.compare import judge as J
from msprobe.compare.engine import CARRIED, EntryResult, StepComparison, dtype_pair, levels_compared_in_part
from msprobe.compare.records import TENSOR_TYPES, Side, flow_of
from msprobe.dump import ANOMALIES, load_construct, load_stacks, read_report
from msprobe.format import naming
from msprobe.format.frames import frame_lines
from msprobe.format.producer import PASSED_ON, SCALAR, SCALAR_NOTE, element_kinds, input_role


#: :meth:`Finding.label` per kind: one term, "first difference", for the entry where two runs part
LABELS = {"divergence": "first difference", "input": "first difference",
          "precision": "first difference of precision", "unmatched": "first unmatched entry",
          "one_sided": "no first difference; entries on one side only",
          "nan": "first NaN/Inf producer", "anomaly": "first anomaly producer (watch mode)"}


@dataclass
class Finding:
    """One named entry (a divergence or a NaN/Inf producer) with where to look.

    Attributes:
        kind: ``divergence`` (inputs agree, outputs do not), ``precision`` (no divergence; the first
            entry whose outputs fail only at a stricter precision than its inputs were judged with,
            or whose inputs differ by no more than the lower precision the runs differ in allows,
            without amplifying their error: the runs differ in precision, e.g. Float16 vs Float32,
            and agree within the lower one up to there; :attr:`EntryResult.precision_limited`), ``input`` (the first differing entry
            already had differing inputs: the difference comes from outside the dump: data,
            parameters, or code that is not dumped), ``unmatched`` (the first entry present on one
            side only: the runs executed different calls), ``one_sided`` (no matched pair differs,
            but entries or records are present on one side only because the dumps capture
            differently, e.g. GRAPH_MODE against PyNative: :attr:`one_sided` and
            :attr:`one_sided_records` list them, the first is :attr:`entry`), ``nan`` (tensor inputs finite, an output NaN/Inf), ``anomaly`` (watch mode's
            ``max_abs``/``norm_jump`` producer, read from ``anomalies.json``; ``note`` says what it found).
        cell_path: enclosing Cell entries, outermost first (from ``construct.json``).
        note: set when the dumps differ in set-up (mode, level, task), which explains unmatched entries;
            kind ``nan``: set when a scalar argument of the producer was non-finite
            (:data:`msprobe.format.producer.SCALAR_NOTE`).
        records: per record: name, result, both sides' statistics, message.
    """

    kind: str
    step: Optional[int]
    rank: str
    entry: str
    golden_entry: Optional[str] = None
    direction: str = "forward"
    cell_path: List[str] = field(default_factory=list)
    target_stack: List[str] = field(default_factory=list)
    golden_stack: List[str] = field(default_factory=list)
    records: List[dict] = field(default_factory=list)
    gain: Optional[float] = None
    #: what the two dumps differ in besides their values (e.g. their levels), or ``None``
    note: Optional[str] = None
    #: tolerance mode: the entry where the difference this entry starts first exceeds the
    #: thresholds, which only carries it on (its error gain ``exceeds_gain`` <= ``entry.gain``; it may
    #: be this entry itself), or ``None``. Set, this entry was chosen by the bitwise rule (as with
    #: ``exact=True``) and its records are told apart bitwise.
    exceeds_at: Optional[str] = None
    exceeds_gain: Optional[float] = None
    #: mix: the Cell entry whose own Parameters, already different, this entry (a call inside it)
    #: takes as inputs (named instead of the Cell: the deepest entry where the difference shows), or
    #: ``None``; :attr:`parameter_inputs` maps each such input record to the Cell's parameter record
    parameters_of: Optional[str] = None
    parameter_inputs: Dict[str, str] = field(default_factory=dict)
    #: ``(target dtype, golden dtype)`` of an input of this entry (or of its forward call; without
    #: one, of an output) whose two sides' dtypes differ, e.g. ``("Float16", "Float32")``; ``None``
    #: when none does (:attr:`EntryResult.dtypes`)
    dtypes: Optional[Tuple[str, str]] = None
    #: kind ``one_sided``: the entries present on one side only, in execution order, and
    #: ``"{entry}.{record}"`` of the records of matched entries that have no counterpart
    one_sided: List[str] = field(default_factory=list)
    one_sided_records: List[str] = field(default_factory=list)

    def _differs(self, rec: dict, exact: bool) -> bool:
        bitwise = exact or self.exceeds_at is not None
        return not (rec.get("bitwise_equal") if bitwise else rec.get("result") == J.PASS)

    def differing_parameters(self, exact: bool = False) -> List[str]:
        """The ``parameters.*`` records (a Cell's own Parameters, L0/mix) that do not agree
        (bitwise with ``exact`` or when :attr:`exceeds_at` is set, else within tolerance), and the
        inputs that are such Parameters of the Cell around this entry (:attr:`parameters_of`), as
        ``"input.1 = parameters.weight of Cell.fc.Dense.forward.0"``."""
        return [self._record_label(rec["record"]) for rec in self.records
                if (rec.get("record", "").startswith("parameters.") or rec.get("record") in self.parameter_inputs)
                and self._differs(rec, exact)]

    def _record_label(self, record: str) -> str:
        """``record``, with the Cell parameter it is when it is one of :attr:`parameter_inputs`."""
        param = self.parameter_inputs.get(record)
        return record if param is None else f"{record} = {param} of {self.parameters_of}"

    def differing_inputs(self, exact: bool = False) -> List[str]:
        """Each input record (``input.N``, a keyword, ``parameters.*``; a backward entry's incoming
        gradients) that does not agree, as ``"NAME: HOW MUCH"`` (see :func:`difference_text`), with
        ``", within tolerance"`` when it differs bitwise only."""
        return [f"{self._record_label(rec['record'])}: {difference_text(rec)}"
                + (", within tolerance" if rec.get("result") == J.PASS else "")
                for rec in self.records if flow_of(rec.get("record", "")) == "in" and self._differs(rec, exact)]

    def label(self) -> str:
        """What this finding is called wherever it is shown (``first-diff``, ``compare``'s printed line
        and summary, the report): ``first difference`` (kinds ``divergence`` and ``input``), ``first
        difference of precision``, ``first unmatched entry``, ``no first difference; entries on one
        side only``, ``first NaN/Inf producer``."""
        return LABELS[self.kind]

    def reason(self, exact: bool = False) -> str:
        """Why this entry is named, in one sentence (``first-diff``, ``compare`` and ``report`` say
        the same); ``""`` for a NaN/Inf producer."""
        return self._raised_text() + self._why(exact) + self._exceeds_text()

    def _raised_text(self) -> str:
        """``"the target run's call raised here (TypeError: ...); "`` when one side's entry has an
        ``error`` record (a Cell whose forward raised, so it has no output), else ``""``."""
        for rec in self.records:
            if rec.get("record") == "error":
                sides = [(side, rec.get(f"{side}_value")) for side in ("target", "golden")]
                said = [f"the {side} run's call {value['value'][len('the call '):]}"
                        if value["value"].startswith("the call ") else f"the {side} run's call: {value['value']}"
                        for side, value in sides if value is not None]
                return "; ".join(said) + " (no output); " if said else ""
        return ""

    def _exceeds_text(self) -> str:
        if self.exceeds_at is None:
            return ""
        gain = "inf" if self.exceeds_gain is None or math.isinf(self.exceeds_gain) else f"{self.exceeds_gain:.3g}"
        if self.exceeds_at == self.entry:
            return f"; its outputs exceed the tolerance only by carrying that difference on (error gain {gain})"
        return (f"; the difference stays within tolerance up to {self.exceeds_at}, which exceeds it only "
                f"by carrying it on (its inputs already differ by nearly as much as its outputs: error "
                f"gain {gain})")

    def _why(self, exact: bool) -> str:
        if self.kind == "divergence":
            arguments = [rec for rec in self.records if flow_of(rec.get("record", "")) == "in"
                         and rec.get("target_value") is not None and rec.get("result") != J.PASS]
            tensors = "tensor inputs" if arguments else "inputs"
            also = f", {arguments_text(arguments)}" if arguments else ""
            if exact or self.exceeds_at or all(rec.get("bitwise_equal") for rec in self.records  # tensors
                                               if flow_of(rec.get("record", "")) == "in"
                                               and rec.get("target_value") is None):
                return f"{tensors} agree{' bitwise' if self.exceeds_at else ''}{also}, outputs do not ({self.direction})"
            return f"{tensors} differ within tolerance{also}, outputs do not agree ({self.direction})"
        if self.kind == "input":
            # none of its own: a backward entry whose forward call's inputs differ
            which = ", ".join(self.differing_inputs(exact)) or "those of its forward call"
            if self.dtypes and self.dtypes[0] != self.dtypes[1]:  # not a value from outside the dump
                what = "parameters" if self.differing_parameters(exact) else "inputs"
                return (f"its {what} already differ ({which}) in dtype (target {self.dtypes[0]}, golden "
                        f"{self.dtypes[1]}): the runs compute in different precisions before this entry")
            if self.differing_parameters(exact):
                return (f"its parameters already differ ({which}): the runs start this call "
                        "with different values of them (initialisation, loading or an earlier update)")
            return (f"its inputs already differ ({which}): the difference comes from outside the dump "
                    "(data, parameters or code that is not dumped)")
        if self.kind == "precision":
            which = f" (target {self.dtypes[0]}, golden {self.dtypes[1]})" if self.dtypes else ""
            if any(rec.get("result") != J.PASS for rec in self.records if flow_of(rec.get("record", "")) == "in"):
                how = ("its inputs differ, by no more than the lower precision's tolerance, and it does not "
                       "amplify that")
            else:
                how = ("its outputs fail only at a stricter precision than its inputs were judged with and "
                       "do not amplify their error")
            return (f"{how}: the runs differ in precision{which} before this entry and agree within the "
                    "lower precision up to here")
        if self.kind == "anomaly":
            return self.note or ""
        if self.kind == "unmatched":
            return "present on one side only " + (f"({self.note})" if self.note else
                                                  "(the runs executed different calls)")
        if self.kind == "one_sided":
            return one_sided_text(len(self.one_sided), len(self.one_sided_records), self.note)
        return ""

    def to_dict(self) -> dict:
        """The finding as JSON-ready data (``first-diff --json``), with its :meth:`label`; stacks as one
        line per frame, innermost first (:mod:`msprobe.format.frames`, as ``msprobe show --all-frames``
        prints)."""
        out = dict(asdict(self), label=self.label())
        out["target_stack"], out["golden_stack"] = frame_lines(self.target_stack), frame_lines(self.golden_stack)
        if out["gain"] is not None and math.isinf(out["gain"]):
            out["gain"] = "inf"
        return out


def one_sided_text(entries: int, records: int, note: Optional[str]) -> str:
    """The sentence of a comparison whose matched pairs all agree but which holds ``entries`` entries
    and ``records`` records of matched entries present on one side only; ``note``: the set-up
    difference of the dumps that explains them (:func:`_setup_difference`), or ``None``."""
    return (f"no matched entry differs beyond the tolerance; {_one_sided_counts(entries, records)} "
            f"{'is' if entries + records == 1 else 'are'} present on one side only and not compared ("
            + (note or "the runs executed different calls") + ")")


def arguments_text(records: List[dict]) -> str:
    """``a scalar argument differs (input.1: value 1 vs 2)`` for the differing non-tensor input
    records (:func:`_record_dict`) of a finding: numbers are scalar arguments, others (a string)
    arguments."""
    numbers = all(isinstance((rec.get("target_value") or {}).get("value"), (int, float)) for rec in records)
    what = "a scalar argument differs" if numbers else "an argument differs"
    if len(records) > 1:
        what = "scalar arguments differ" if numbers else "arguments differ"
    return f"{what} ({', '.join(rec['record'] + ': ' + difference_text(rec) for rec in records)})"


def _one_sided_counts(entries: int, records: int) -> str:
    """``"3 entries and 1 record of a matched entry"``: what is present on one side only."""
    return " and ".join(f"{n} {one if n == 1 else many}" for n, one, many in
                        ((entries, "entry", "entries"), (records, "record of a matched entry",
                                                         "records of matched entries")) if n)


def difference_text(rec: dict) -> str:
    """How much one record (a :func:`_record_dict`) differs, in words: ``"largest scaled statistic
    error 2.3e-05"`` (statistics mode: the number the thresholds judge), ``"relative L2 error 0.012"``
    (tensor mode), ``"CRC-32 differs"`` (md5 mode), ``"value 'tanh' vs 'none'"`` (a scalar or string
    argument), ``"only in golden"`` / ``"only in target"`` (a record with no counterpart:
    :func:`one_side_text`), or the judgement's message (a shape or one-sided NaN/Inf)."""
    t, g = rec.get("target_value"), rec.get("golden_value")
    if t is not None or g is not None:
        return f"value {t and t['value']!r} vs {g and g['value']!r}"
    error, what = rec.get("error"), rec.get("error_kind")
    alone = one_side_text(rec)
    if alone is not None:
        return alone
    if what is None:
        return "CRC-32 differs"
    if (error is None or math.isinf(error)) and rec.get("message"):
        return rec["message"]
    return f"{what} {'inf' if error is None or math.isinf(error) else format(error, '.3g')}"


def one_side_text(rec: dict) -> Optional[str]:
    """``"only in golden"`` or ``"only in target"`` for a record (a :func:`_record_dict`) that one run
    has and the other does not (e.g. a backward output GRAPH_MODE does not record), else ``None``: it
    is not a difference of values."""
    if rec.get("target") is None and rec.get("golden") is not None:
        return "only in golden"
    if rec.get("golden") is None and rec.get("target") is not None:
        return "only in target"
    return None


def cell_path(entry: str, construct: dict) -> List[str]:
    """Enclosing Cell entries of ``entry`` (``construct.json``: entry name -> parent Cell entry or
    None), outermost first; ``[]`` for an entry at the top level or absent from ``construct``."""
    path, seen, parent = [], set(), construct.get(entry)
    while parent and parent not in seen:
        seen.add(parent)
        path.append(parent)
        parent = construct.get(parent)
    return path[::-1]


def shown_cell_path(entry: str, construct: dict) -> List[str]:
    """The Cell path shown with ``entry`` (``first-diff``, ``show``, the report): :func:`cell_path`,
    except for a parameter-gradient entry (``Cell.b1.fc.Dense.parameters_grad.0``, which
    ``construct.json`` does not hold): the path of the Cell call it belongs to, that call included
    (its backward entry, or its forward entry when ``construct.json`` has no backward one)."""
    calls = naming.param_grad_calls(entry) if entry not in construct else None
    for own in reversed(calls or ()):
        if own in construct:
            return cell_path(own, construct) + [own]
    return cell_path(entry, construct)


def _argument_differs(records) -> bool:
    """Whether a scalar or string argument (an input record that is not a tensor) differs."""
    return any(r.flow == "in" and not r.is_tensor and r.target is not None and r.golden is not None
               and r.result != J.PASS for r in records)


def _agrees(judged: J.Judged, exact: bool) -> bool:
    return judged.exact if exact else judged.result == J.PASS


def _record_dict(j: J.Judged) -> dict:
    t, g = j.target, j.golden
    return {"record": (t or g).key, "result": j.result, "bitwise_equal": j.exact,
            "target": dict(zip(("Max", "Min", "Mean", "Norm"), t.stats)) if t else None,
            "golden": dict(zip(("Max", "Min", "Mean", "Norm"), g.stats)) if g else None,
            "target_dtype": t.dtype if t else None, "golden_dtype": g.dtype if g else None,
            "target_value": _scalar(t), "golden_value": _scalar(g),
            "metrics": {k: v for k, v in j.metrics.items() if v is not None},
            "error": j.error, "error_kind": _error_kind(j),
            "message": "; ".join(j.messages)}


def _error_kind(j: J.Judged) -> Optional[str]:
    """What :attr:`Judged.error` measures: ``None`` in md5 mode (no magnitude)."""
    if "Cosine" in j.metrics:
        return "relative L2 error"
    if "Max diff" in j.metrics:
        return "largest scaled statistic error"
    return None


def _scalar(record):
    """``{"value": ...}`` for a scalar/string argument's record (its value as written), else None."""
    if record is None or record.kind in TENSOR_TYPES:
        return None
    return {"value": record.value}


def agreement(mode: str, differs_bitwise: bool) -> str:
    """What is said of a compared step/rank in which no entry differs (``first-diff``, ``compare``'s
    printed line and summary, the report): ``the runs agree within tolerance but differ bitwise
    (...)`` when some record differs within tolerance, else ``the runs agree bitwise``, saying in
    statistics and md5 mode what was found equal (the tensors themselves are not in those dumps).

    Args:
        mode (str): the comparison's mode (``statistics``, ``tensor``, ``md5``).
        differs_bitwise (bool): some entry compared differs bitwise (:meth:`DivergenceFinder.differs_bitwise`).
    """
    if differs_bitwise:
        return "the runs agree within tolerance but differ bitwise (--exact names where they first differ)"
    what = {J.STATISTICS: " (every statistic recorded is equal)",
            J.MD5: " (every statistic and CRC-32 recorded is equal)"}.get(mode, "")
    return "the runs agree bitwise" + what


def first_divergence(comparison: StepComparison, exact: bool = False,
                     bitwise: Optional[List[StepComparison]] = None) -> Optional[Finding]:
    """The first difference of one compared step/rank (see the module docstring), None when every
    entry agrees. ``bitwise``: a list to which ``comparison`` is appended when it agrees within
    tolerance (None or a ``one_sided`` finding is returned, ``exact=False``) but some entry differs
    bitwise.

    Forward entries are searched first, then backward ones. In each, an entry present on one side
    only (``kind="unmatched"``) that runs before the first difference is named instead: the runs
    executed different calls there. When no entry has agreeing inputs and differing outputs, the
    first differing entry is returned with ``kind="input"``. When the dumps capture differently
    (GRAPH_MODE against PyNative), entries and records present on one side only are listed
    (``kind="one_sided"`` when no matched pair differs), never named."""
    finder = DivergenceFinder.of(comparison, exact)
    for entry in comparison.entries():
        finder.add(entry)
    found = finder.result(comparison)
    if (found is None or found.kind == "one_sided") and bitwise is not None and finder.differs_bitwise():
        bitwise.append(comparison)
    return found


class DivergenceFinder:
    """The rule of :func:`first_divergence`, fed one compared entry at a time (in execution order), so
    ``msprobe compare`` names the same entry as ``msprobe first-diff`` from its own pass."""

    def __init__(self, exact: bool = False, leave_out=None, construct: Optional[dict] = None,
                 listed=None):
        """``leave_out``: a predicate on unmatched entries that are not counted as a difference
        (:meth:`StepComparison.recorded_at_one_level_only`), or None. ``listed``: a predicate on
        entries, True when their entries and records present on one side only are listed and never
        named as a difference (:meth:`StepComparison.captured_differently`: the dumps' modes
        differ), or None. ``construct``: the target's
        ``construct.json`` (:attr:`StepComparison.construct`), which tells the entries that run inside
        a Cell call; None: loaded by :meth:`result`, and a Cell's nested entries are not told apart
        while entries are added."""
        self.exact = exact
        self.leave_out = leave_out
        self.listed = listed
        self.unmatched = {"forward": None, "backward": None}
        self.construct = construct
        self.found = {"forward": [], "backward": []}
        #: entries whose only differing inputs are their own Parameters (``parameters.*``, L0/mix) and
        #: whose outputs differ: a Cell whose state differs, where a difference inside a found Cell starts
        self.changed_state = {"forward": [], "backward": []}
        self._seq = {}
        #: entries present on one side only, and records of matched entries without a counterpart
        #: (``"{entry}.{record}"``): listed, never the first difference
        self.one_sided: List[str] = []
        self.one_sided_records: List[str] = []
        self._first_one_sided: Optional[EntryResult] = None  # the first entry holding either
        self.first_precision = None
        self.first_input = None
        #: entries whose own Parameters (``parameters.*``) do not agree, by target name
        self._with_parameters = {}
        #: Cell entry name -> (the first entry directly inside it whose differing inputs include
        #: those Parameters, {its input record: the Cell's parameter record}) (mix)
        self.uses = {}
        #: tolerance mode: the first entry (before any source of its direction) whose inputs pass and
        #: whose outputs fail but only carry on what its inputs already differ by (gain <= limit); the
        #: innermost such entry inside it when it is a Cell
        self.grown = None
        #: the first such entry: the bitwise rule is fed the entries up to it and those inside it
        self._grown_call = None
        #: an entry outside :attr:`_grown_call` came after it: the bitwise rule is fed no more
        self._past_grown = False
        #: tolerance mode: the bitwise rule fed the same entries up to the end of the call of
        #: :attr:`grown`, which names where the difference that grows over the thresholds there starts
        self.bitwise = None if exact else DivergenceFinder(True, leave_out, construct, listed)
        #: tolerance mode: ``(order, target name)`` of the entries fed to the bitwise rule that fail
        #: the thresholds (a record not ``pass``), other than differences of precision
        self._failing = []

    @classmethod
    def of(cls, comparison: StepComparison, exact: bool = False) -> "DivergenceFinder":
        """The finder of ``comparison``'s first difference (its level, mode and ``construct.json``)."""
        return cls(exact, comparison.recorded_at_one_level_only, comparison.construct,
                   comparison.captured_differently)

    def add(self, entry: EntryResult) -> None:
        exact = self.exact
        way = naming.direction_of(entry.name)
        fed = self.bitwise is not None and self._feeds_bitwise(entry)
        if fed:
            self.bitwise.add(entry)
        if entry.match == "unmatched":
            if not entry.records:  # every record of it matched an ``ignore`` pattern: left out
                return
            if self.leave_out is not None and self.leave_out(entry):  # only mix records it
                return
            if self.listed is not None and self.listed(entry):  # the other dump cannot hold it
                self.one_sided.append(entry.name)
                self._first_one_sided = self._first_one_sided or entry
            elif self.unmatched[way] is None and not self.found[way]:
                self.unmatched[way] = entry
            return
        paired = entry.records
        if self.listed is not None and self.listed(entry):  # e.g. backward output, not in GRAPH_MODE's
            paired = [r for r in entry.records if r.target is not None and r.golden is not None]
        if len(paired) < len(entry.records):
            self.one_sided_records.extend(f"{entry.name}.{(r.target or r.golden).key}" for r in entry.records
                                          if r.target is None or r.golden is None)
            self._first_one_sided = self._first_one_sided or entry
        if all(_agrees(r, exact) for r in paired):
            return
        self._seq[id(entry)] = len(self._seq)
        if fed and not entry.precision_limited and any(r.result != J.PASS for r in entry.records):
            self._failing.append((self._seq[id(entry)], entry.target))
        inputs_agree = entry.inputs_exact if exact else entry.inputs_agree
        if inputs_agree and self.first_input is not None and _argument_differs(paired):
            # a scalar argument that differs is a value from outside the dump, as differing data
            # are: an earlier entry whose inputs already differ comes first
            inputs_agree = False
        if inputs_agree and any(not _agrees(r, exact) for r in paired if r.flow == "out"):
            if exact or entry.verdict != CARRIED:
                self.found[way].append(entry)
            elif entry.precision_limited:  # agrees within the inputs' precision, not amplified
                self.first_precision = self.first_precision or entry
            elif self.grown is None and not self.found[way]:
                self.grown = self._grown_call = entry
            elif self.grown is not None and self._inside(entry, self.grown):
                self.grown = entry  # where inside the Cell the carried difference exceeds the thresholds
        elif not exact and entry.precision_limited:  # its inputs differ only within the runs' lower precision
            self.first_precision = self.first_precision or entry
        else:
            if _only_parameters_differ(entry, exact):
                self.changed_state[way].append(entry)
            self._note_parameter_use(entry)
            if self.first_input is None:
                self.first_input = entry

    def _note_parameter_use(self, entry: EntryResult) -> None:
        """``entry``'s inputs differ: remember it when its own Parameters differ, and, when it runs
        directly inside such a Cell (mix) and some differing input of it is one of that Cell's
        differing Parameters (equal dtype, shape and statistics on both sides), as the first entry
        of that Cell using them (:attr:`uses`)."""
        if entry.target is None:
            return
        params = [r for r in entry.records if r.flow == "in" and r.target is not None
                  and r.target.key.startswith("parameters.") and not _agrees(r, self.exact)]
        if params:
            self._with_parameters[entry.target] = params
        cell = self.construct.get(entry.target) if self.construct else None
        if cell is None or cell in self.uses or cell not in self._with_parameters:
            return
        used = {}
        for r in entry.records:
            if r.flow == "in" and not _agrees(r, self.exact):
                same = [p for p in self._with_parameters[cell] if _same_values(r, p)]
                if same:
                    used[r.target.key] = same[0].target.key
        if used:
            self.uses[cell] = (entry, used)

    def _inside(self, entry: EntryResult, cell: EntryResult) -> bool:
        """Whether ``entry`` runs inside the call of the Cell entry ``cell`` (``construct.json``)."""
        return (self.construct is not None and entry.target is not None and cell.target is not None
                and cell.target in cell_path(entry.target, self.construct))

    def _feeds_bitwise(self, entry: EntryResult) -> bool:
        """Whether the bitwise rule is fed ``entry``: every entry up to :attr:`grown`, then the entries
        that run inside its call (a Cell entry is written before the calls inside it, which its
        output waits for), while they follow it."""
        if self._grown_call is None:
            return True
        if self._past_grown:
            return False
        if entry.target is None or self._inside(entry, self._grown_call):
            return True
        self._past_grown = True
        return False

    def differs_bitwise(self) -> bool:
        """Tolerance mode: whether some entry fed so far differs bitwise (an unmatched one counted
        as :meth:`result` counts it); False with ``exact=True``."""
        b = self.bitwise
        return b is not None and bool(b.first_input or any(b.found.values()) or any(b.unmatched.values()))

    def result(self, comparison: StepComparison) -> Optional[Finding]:
        construct = self.construct
        if construct is None:
            construct = load_construct(comparison.target.directory)
        for way in ("forward", "backward"):
            if self.unmatched[way] is not None:
                return _finding("unmatched", comparison, self.unmatched[way], construct)
            if self.grown is not None and naming.direction_of(self.grown.name) == way:
                return self._origin(comparison, construct)
            if self.found[way]:
                kind, entry = _innermost(self.found[way], self.changed_state[way], self._seq, construct)
                return self._named(kind, comparison, entry, construct)
        if self.first_precision is not None:
            return _finding("precision", comparison, self.first_precision, construct)
        if self.first_input is not None:
            return self._named("input", comparison, self.first_input, construct)
        if self.one_sided or self.one_sided_records:
            return self._one_sided(comparison, construct)
        return None

    def _one_sided(self, comparison: StepComparison, construct: dict) -> Finding:
        """No matched pair differs: the finding ``one_sided`` listing what is on one side only, named
        by the first entry, in execution order, present on one side only or holding such a record."""
        found = _finding("one_sided", comparison, self._first_one_sided, construct)
        found.one_sided, found.one_sided_records = list(self.one_sided), list(self.one_sided_records)
        return found

    def _named(self, kind: str, comparison: StepComparison, entry: EntryResult, construct: dict) -> Finding:
        """The finding of ``entry``; a Cell whose own Parameters differ (``kind="input"``) gives way to
        the first call inside it (mix) that takes them as inputs (:attr:`uses`), with the Cell in
        :attr:`Finding.parameters_of`: the deepest entry where the difference shows."""
        use = self.uses.get(entry.target) if kind == "input" else None
        if use is None:
            return _finding(kind, comparison, entry, construct)
        inner, used = use
        found = _finding("input", comparison, inner, construct)
        found.parameters_of, found.parameter_inputs = entry.target, used
        return found

    def _origin(self, comparison: StepComparison, construct: dict) -> Finding:
        """Where the difference that first exceeds the thresholds at :attr:`grown` starts: what the
        bitwise rule names among the entries up to it, with ``exceeds_at`` set to :attr:`grown`."""
        found = self.bitwise.result(comparison)
        if found is None:  # not reached: the inputs of :attr:`grown` differ bitwise
            found = _finding("divergence", comparison, self.grown, construct)
        if not self._exceeded_before_grown():
            found.exceeds_at, found.exceeds_gain = self.grown.name, self.grown.gain
        return found

    def _exceeded_before_grown(self) -> bool:
        """Whether an entry computed before :attr:`grown` already fails the thresholds: one that runs
        before it (other than a Cell whose call holds it), or one inside its call (a Cell's output is
        computed after the calls inside it)."""
        at, name = self._seq[id(self.grown)], self.grown.target
        construct = self.construct or {}
        holders = set(cell_path(name or "", construct))
        return any(seq != at and ((seq < at and target not in holders)
                                  or (name is not None and name in cell_path(target or "", construct)))
                   for seq, target in self._failing)


def _innermost(group: List[EntryResult], changed: List[EntryResult], seq: dict,
               construct: dict) -> Tuple[str, EntryResult]:
    """``("divergence", the first of group)``; while a later one of ``group``, or one of ``changed``
    (a Cell whose own Parameters differ, ``"input"``), lies inside it, that one (``changed`` first
    when both lie inside: the Cell's differing state is what its enclosing Cells carry)."""
    kind, best = "divergence", group[0]
    candidates = sorted([(e, "input") for e in changed] + [(e, "divergence") for e in group[1:]],
                        key=lambda pair: (seq[id(pair[0])], pair[1] != "input"))
    for entry, how in candidates:
        if best.target is not None and best.target in cell_path(entry.target or "", construct):
            kind, best = how, entry
    return kind, best


def _same_values(record: J.Judged, param: J.Judged) -> bool:
    """Whether two judged records hold the same tensors on both sides (dtype, shape, statistics)."""
    return all(a is not None and b is not None and (a.dtype, a.shape, a.stats) == (b.dtype, b.shape, b.stats)
               for a, b in ((record.target, param.target), (record.golden, param.golden)))


def _only_parameters_differ(entry: EntryResult, exact: bool) -> bool:
    """Whether ``entry``'s outputs differ bitwise while of its inputs only its own Parameters
    (``parameters.*``) do (bitwise); its other inputs agree (bitwise with ``exact``)."""
    params = [r for r in entry.records if r.flow == "in" and (r.target or r.golden).key.startswith("parameters.")]
    others = [r for r in entry.records if r.flow == "in" and r not in params]
    return (any(not r.exact for r in params) and all(_agrees(r, exact) for r in others)
            and any(not r.exact for r in entry.side("out")))


def _finding(kind: str, comparison: StepComparison, entry: EntryResult, construct: dict) -> Finding:
    name = entry.name
    t_stacks = load_stacks(comparison.target.directory)
    g_stacks = load_stacks(comparison.golden.directory)
    path = shown_cell_path(name, construct) if entry.target is not None else []
    if not path and entry.golden is not None:  # an entry of the golden only, or an L1 target: its Cells
        path = shown_cell_path(entry.golden, load_construct(comparison.golden.directory))
    return Finding(kind, comparison.step, comparison.rank, name, entry.golden, naming.direction_of(name),
                   path, t_stacks.get(_forward_of(entry.target), []),
                   g_stacks.get(_forward_of(entry.golden), []),
                   [_record_dict(r) for r in entry.records], entry.gain, _setup_difference(comparison),
                   dtypes=entry.dtypes or dtype_pair(entry.records))


def _setup_difference(comparison: StepComparison) -> Optional[str]:
    """That one dump ran in GRAPH_MODE and the other under PyNative (``dump.json``'s ``mode``), or
    ``"the dumps were taken at different levels (L1 vs mix)"`` (likewise for the task), or
    that one dump holds only part of its step (its ``dump.json`` ``partial``, e.g. watch mode's
    history: :attr:`StepComparison.partial_note`), or ``None``: entries of one level only are
    unmatched without the runs having executed different calls."""
    t, g = comparison.target.header, comparison.golden.header
    if t.get("mode") != g.get("mode"):  # dump.json says "mode": "GRAPH_MODE"; PyNative writes no field
        graph, other = ("target", "golden") if t.get("mode") else ("golden", "target")
        return (f"the {graph} dump ran in GRAPH_MODE and the {other} one under PyNative: "
                + mode_difference((t if t.get("mode") else g).get("level")))
    if levels_compared_in_part(t, g):
        return level_note(t, g)
    if {t.get("level"), g.get("level")} == {"L0", "L1"}:
        return (f"the dumps were taken at different levels ({t['level']} vs {g['level']}), which record no "
                "entry in common (L0 Cells, L1 APIs): compare each with a dump of the other run taken at "
                "the same level, or at mix")
    if (t.get("level") == "debug") != (g.get("level") == "debug") and t.get("level") and g.get("level"):
        return (f"the dumps were taken at different levels ({t['level']} vs {g['level']}): a debug dump holds "
                "only the values save() recorded, which no other level records, so no entry can match "
                "(--ignore cannot help): compare it with a debug dump of the other run")
    for key, what in (("level", "levels"), ("task", "tasks")):
        if t.get(key) and g.get(key) and t[key] != g[key]:
            return (f"the dumps were taken at different {what} ({t[key]} vs {g[key]}): entries that "
                    f"one {key} records and the other does not are unmatched (leave them out with "
                    f"--ignore patterns, e.g. --ignore 'Cell.*')")
    if comparison.partial_note:
        return comparison.partial_note
    for side, header in (("target", t), ("golden", g)):
        if header.get("partial"):  # sharing no entry with the other side
            return (f"the {side} dump holds only part of its step ({header['partial']}) and shares no entry "
                    f"with the other dump")
    return None


def mode_difference(level: Optional[str]) -> str:
    """What a GRAPH_MODE dump at ``level`` does not record that a PyNative one does (only what
    holds at that level): at L0 and mix no gradient w.r.t. a Cell's inputs, at mix and L1 the
    compiled training step is one Jit entry with no API entry inside it."""
    parts = []
    if level in ("L0", "mix", None):
        parts.append("msprobe records no gradient w.r.t. a Cell's inputs (backward output)")
    if level in ("mix", "L1", None):
        parts.append("the training step MindSpore compiles is one Jit entry with no API entry inside it")
    return "in compiled graphs " + ", and ".join(parts)


def one_sided_note(found: Finding) -> str:
    """The note of a step/rank whose matched pairs all agree but which holds entries or records on
    one side only by the nature of the two dumps' modes (a :class:`Finding` of kind ``one_sided``):
    what is on one side only, counted, and why (:attr:`Finding.note`)."""
    return (f"{_one_sided_counts(len(found.one_sided), len(found.one_sided_records))} on one side only, "
            "not compared ("
            + (found.note or "the runs executed different calls") + ")")


def agreement_of(found: Optional[Finding]) -> Tuple[Optional[Finding], Optional[str]]:
    """``(finding, note)``: a finding of kind ``one_sided`` is no difference (the dumps capture
    differently, every matched pair agrees): ``(None, its one_sided_note)``; any other is
    ``(found, None)``."""
    if found is not None and found.kind == "one_sided":
        return None, one_sided_note(found)
    return found, None


def level_note(target_header: dict, golden_header: dict) -> str:
    """What is compared of a ``mix`` dump against an ``L0``/``L1`` one (:func:`levels_compared_in_part`)."""
    t, g = target_header["level"], golden_header["level"]
    lower = t if g == "mix" else g
    return (f"the dumps were taken at different levels ({t} vs {g}): the {'Cell' if lower == 'L0' else 'API'} "
            f"entries both record are compared, those only mix records are left out")


def _forward_of(entry: Optional[str]) -> Optional[str]:
    """Stacks are recorded for forward entries; a backward entry shows its forward call's stack."""
    return naming.forward_of(entry) or entry


def _finite(rec) -> bool:
    """Whether the record's tensor holds no NaN/Inf element, from its Max and Min
    (:func:`msprobe.format.producer.element_kinds`: a Mean NaN from +Inf beside -Inf is no NaN)."""
    return not element_kinds({"Max": rec.stats[0], "Min": rec.stats[1]})


def nan_producers(directory: str, step: Optional[int] = None, rank: str = "",
                  side: Optional[Side] = None, run: str = "target") -> Optional[Finding]:
    """The first producer of a NaN/Inf in one step/rank directory: in execution order, forward
    first, the first entry whose input records are all finite and one of whose outputs is not
    (innermost, as for divergences). The inputs of the entries that also feed an entry count as its
    inputs (:func:`msprobe.format.naming.upstream_names`: a backward entry's forward call, a Cell's
    parameter gradients' forward and backward calls), so the gradient of a call whose forward input
    was already NaN is not a producer. Only tensor inputs count (:func:`msprobe.format.producer.input_role`,
    as in watch mode): a call fed a non-finite Python number (``x * float('nan')``) that makes a
    NaN/Inf tensor is the producer, and its finding's ``note`` says so. None when no output is NaN/Inf.

    ``run`` (``"target"`` or ``"golden"``) is which run of a comparison the directory holds: the
    finding's statistics (each record's ``target`` or ``golden`` key), its stack
    (:attr:`Finding.target_stack` or :attr:`Finding.golden_stack`) and, for the golden run,
    :attr:`Finding.golden_entry` are filled on that side."""
    side = side or Side(directory)
    construct = load_construct(directory)
    found = {"forward": [], "backward": []}
    finite_inputs, scalar_fed = {}, set()
    for i, name in enumerate(side.names):
        recs = side.records(i)
        roles = {input_role(r.is_tensor, _finite(r)) for r in recs if r.flow == "in"}
        own = PASSED_ON not in roles
        if SCALAR in roles:
            scalar_fed.add(name)
        finite_inputs[name] = own
        fed = own and all(finite_inputs.get(n, True) for n in naming.upstream_names(name))
        if fed and not all(_finite(r) for r in recs if r.flow == "out"):
            found[naming.direction_of(name)].append(name)
    for want in ("forward", "backward"):
        names = found[want]
        if not names:
            continue
        best = names[0]
        for name in names[1:]:
            if best in cell_path(name, construct):
                best = name
        recs = side.records(side.index[best])
        found = Finding("nan", step, rank, best, None, want, shown_cell_path(best, construct),
                        records=[{"record": r.key, "finite": _finite(r), "dtype": r.dtype,
                                  run: dict(zip(("Max", "Min", "Mean", "Norm"), r.stats))} for r in recs],
                        note=SCALAR_NOTE if best in scalar_fed else None)
        return _on_side(found, run, load_stacks(directory).get(_forward_of(best), []))
    return watch_producer(directory, step, rank, side, construct, run)


def _on_side(found: Finding, run: str, stack: List[str]) -> Finding:
    """``found`` (a finding of one run) with ``stack`` as the stack of ``run`` (``"target"`` or
    ``"golden"``), and, for the golden run, its entry as :attr:`Finding.golden_entry`."""
    if run == "golden":
        found.golden_entry, found.golden_stack = found.entry, stack
    else:
        found.target_stack = stack
    return found


def watch_producer(directory: str, step: Optional[int], rank: str, side: Side,
                   construct: dict, run: str = "target") -> Optional[Finding]:
    """Watch mode's producer of a magnitude anomaly (``kind`` ``max_abs`` or ``norm_jump`` in the
    directory's ``anomalies.json``), as a finding of kind ``anomaly`` whose ``note`` is the
    trigger's text; ``None`` when the directory holds no such record or its producer is not in
    ``dump.json``. (NaN/Inf are found from the statistics themselves.) ``run``: as for
    :func:`nan_producers`."""
    found = read_report(directory, ANOMALIES)
    if not isinstance(found, dict) or found.get("kind") not in ("max_abs", "norm_jump"):
        return None
    entry = found.get("producer")
    if entry not in side.index:
        return None
    return _on_side(Finding("anomaly", step, rank, entry, None, naming.direction_of(entry),
                            shown_cell_path(entry, construct), note=found.get("trigger")),
                    run, load_stacks(directory).get(_forward_of(entry), []))
