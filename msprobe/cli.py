"""The ``msprobe`` command: summary, compare, first-diff, show, report.

Exit codes (every command):
    0  success; for ``first-diff``: the runs agree within tolerance (one dump: no NaN/Inf producer)
    1  ``first-diff`` only: a first difference was found, other than one of precision only (one
       dump: a NaN/Inf producer was found)
    2  bad input: a path that is not a dump, dumps that cannot be paired, a bad option value
  141  standard output was closed before everything was printed (``msprobe first-diff ... | head``):
       the command stops quietly with the status a shell gives a command ended by SIGPIPE (128 + 13);
       files it writes (compare results, a report) were written before it printed
"""
from __future__ import annotations

import difflib
import functools
import json
import logging
import os
import sys
from typing import Optional

import click

from msprobe.format.frames import frame_line, frame_lines

EXIT_OK, EXIT_DIVERGED, EXIT_BAD_INPUT = 0, 1, 2
EXIT_STDOUT_CLOSED = 128 + 13  # what a shell reports for a command that SIGPIPE ended


def _int_list(ctx, param, value: Optional[str]):
    if value is None:
        return None
    try:
        return [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(f"{value!r}: expected comma-separated integers, e.g. 0,1")


def _bad_input(func):
    """Turn the errors a bad input raises into one message and exit code 2; a closed standard
    output into a quiet exit with :data:`EXIT_STDOUT_CLOSED`."""
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        from msprobe.dump import DumpFormatError

        try:
            try:
                return func(*args, **kwargs)
            finally:  # what is still buffered fails here, not at interpreter exit
                sys.stdout.flush()
        except BrokenPipeError:
            _stdout_closed()
        except (ValueError, FileNotFoundError, DumpFormatError, OSError) as exc:
            click.echo(f"msprobe: error: {exc}", err=True)
            sys.exit(EXIT_BAD_INPUT)
    return wrapper


def _stdout_closed() -> None:
    """The reader of standard output went away: drop what is left to print and exit quietly."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())  # the flush at interpreter exit must not fail again
    os.close(devnull)
    sys.exit(EXIT_STDOUT_CLOSED)


def _show_warnings() -> None:
    """The library's WARNINGs (logger ``msprobe``) on standard error as ``msprobe: WARNING: ...``."""
    log = logging.getLogger("msprobe")
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("msprobe: %(levelname)s: %(message)s"))
        log.addHandler(handler)


_step_opt = click.option("--step", callback=_int_list, metavar="N[,N...]",
                         help="Only these steps (default: every step present on both sides).")
_rank_opt = click.option("--rank", callback=_int_list, metavar="R[,R...]",
                         help="Only these ranks (default: all).")
_mapping_opt = click.option("--mapping", "-dm", "mapping", type=click.Path(exists=True, dir_okay=False),
                            help="YAML/JSON name map {target name or API: golden name or API}.")
_thresholds_opt = click.option("--thresholds", type=click.Path(exists=True, dir_okay=False),
                               help="YAML overriding any part of msprobe/compare/thresholds.yaml.")
_ignore_opt = click.option("--ignore", "ignore", multiple=True, metavar="PATTERN",
                           help="Leave out records whose name {entry}.{key} matches this shell-style "
                                "pattern (repeatable), e.g. 'Primitive.*.BatchNorm.*.output.[12]'.")
_mode_opt = click.option("--mode", type=click.Choice(["statistics", "tensor", "md5"]), default=None,
                         help="Compare mode (default: tensor for two tensor dumps, md5 when both "
                              "carry CRC-32, else statistics).")


def _judging_opts(func):
    """The options that choose what is compared and how: mode, mapping, thresholds, ignore."""
    for option in (_ignore_opt, _thresholds_opt, _mapping_opt, _mode_opt):
        func = option(func)
    return func


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="msprobe-mindspore")
def main():
    """msprobe for MindSpore: read, compare and report precision dumps.

    Exit codes: 0 success (first-diff: runs agree, or differ in precision only), 1 first-diff found a
    first difference or a NaN/Inf producer, 2 bad input, 141 standard output closed early (e.g. piped into head).
    """
    _show_warnings()


@main.command()
@click.argument("dump", type=click.Path(exists=True))
@_bad_input
def summary(dump):
    """Summarize DUMP (a dump_path): steps, entries, first NaN/Inf entry and producer."""
    from msprobe.dump import summarize

    click.echo(summarize(dump))


@main.command()
@click.option("-tp", "--target_path", "--target-path", "target", required=True,
              type=click.Path(exists=True), help="Target dump: dump.json, step/rank dir, step dir or dump_path.")
@click.option("-gp", "--golden_path", "--golden-path", "golden", required=True,
              type=click.Path(exists=True), help="Golden (bench) dump, same forms as the target.")
@click.option("-o", "--output_path", "--output-path", "out_dir", default="./output", show_default=True,
              type=click.Path(file_okay=False), help="Directory for the result files.")
@_judging_opts
@_step_opt
@_rank_opt
@click.option("--xlsx", is_flag=True, help="Also write compare_result_*.xlsx.")
@click.option("-s", "--stack", "stack", is_flag=True, help="Add the target's call stack (NPU_Stack_Info).")
@_bad_input
def compare(target, golden, out_dir, mode, step, rank, mapping, thresholds, ignore, xlsx, stack):
    """Compare TARGET with GOLDEN record by record.

    Writes compare_result_{rank}_{timestamp}.csv per step/rank pair (with _step{N} when several
    steps are compared) and compare_summary_{timestamp}.json into OUT_DIR. Steps present on one
    side only are not compared; a note names them, and the summary's unpaired_steps lists their
    numbers per side ({"target_only": [...], "golden_only": [...]}). Exit 0 when written.
    """
    from msprobe.compare import compare_to_files
    from msprobe.compare.inputs import unpaired_steps

    result = compare_to_files(target, golden, out_dir, xlsx=xlsx, stack=stack, mode=mode, step=step,
                              rank=rank, mapping=mapping, thresholds=thresholds, ignore=ignore)
    for item in result["results"]:
        counts = ", ".join(f"{v} {k}" for k, v in sorted(item["records"].items()))
        where = f"step {item['step']} {item['rank']}" if item["step"] is not None else item["rank"]
        first = _first_difference_text(item["first_difference"], item["agreement"])
        click.echo(f"{where} ({item['mode']}): {counts}; {first}")
        if item["one_sided"]:
            click.echo(f"  note: {item['one_sided']}")
        click.echo(f"  {item['csv']}")
    unpaired = unpaired_steps(target, golden, step)
    if unpaired:
        click.echo(f"note: {unpaired}")
    click.echo(f"summary: {result['summary']}")


def _first_difference_text(found: Optional[dict], agreement: Optional[str] = None) -> str:
    """``compare``'s line about the first difference (a summary's ``first_difference``), with the
    label and entry ``first-diff`` prints for the same pair; ``agreement``: the summary's
    ``agreement`` (what is said when no entry differs)."""
    if found is None:
        return f"first difference (as msprobe first-diff): none: {agreement}"
    why = []
    if found.get("parameters_differ"):
        why.append("its parameters already differ: " + ", ".join(found["parameters_differ"]))
    elif found["kind"] == "input":
        why.append("its inputs already differ")
    if found["kind"] == "unmatched":
        why.append("present on one side only")
    if found["kind"] == "precision":
        why.append("the runs differ in precision" + (" (target {}, golden {})".format(*found["dtypes"])
                                                     if found.get("dtypes") else ""))
    if found.get("exceeds_at"):
        why.append(f"it first exceeds the thresholds at {found['exceeds_at']}")
    return (f"{found['label']} (as msprobe first-diff): {found['entry']} ("
            + "; ".join([found["direction"], *why]) + ")")


def _record_text(values: dict, scalar) -> str:
    """A record as text: a tensor's statistics, or a scalar/string argument's value (``scalar``)."""
    if scalar is not None:
        return f"value={scalar['value']!r}"
    return f"Max={values['Max']} Min={values['Min']} Mean={values['Mean']} Norm={values['Norm']}"


#: the tensor-mode comparison values a record of a finding shows, after its statistics
_TENSOR_METRICS = ("Cosine", "EucDist", "MaxAbsErr", "MaxRelativeErr")


def _tensor_metrics_text(rec: dict) -> str:
    """``tensors: relative L2 error=... Cosine=... EucDist=... MaxAbsErr=... MaxRelativeErr=...``: what
    tensor mode computed from the two saved arrays of a finding's record (``""`` when the record was
    judged on statistics). Cosine is shown to 9 digits (a cosine 1 - 5e-7 is not 1)."""
    metrics = rec.get("metrics") or {}
    if "Cosine" not in metrics:
        return ""
    values = [f"relative L2 error={rec['error']:.6g}"] if rec.get("error_kind") == "relative L2 error" else []
    values += [f"{k}={metrics[k]:.9g}" if k == "Cosine" else f"{k}={metrics[k]:.6g}"
               for k in _TENSOR_METRICS if k in metrics]
    return "tensors: " + " ".join(values)


def _print_finding(f, label: str, exact: bool = False, all_frames: bool = False) -> None:
    from msprobe.compare.divergence import one_side_text

    where = f"step {f.step} {f.rank}" if f.step is not None else f.rank
    click.echo(f"{label} ({where}, {f.direction}): {f.entry}"
               + (f"  [golden: {f.golden_entry}]" if f.golden_entry and f.golden_entry != f.entry else ""))
    reason = f.reason(exact)
    if reason:
        click.echo(f"  {reason}")
    if f.note and f.kind != "unmatched":  # its reason holds the note
        click.echo(f"  note: {f.note}")
    click.echo(f"  Cell path: {' > '.join(f.cell_path) if f.cell_path else _no_cell_path(f.entry)}")
    for rec in f.records:
        t, g = rec.get("target"), rec.get("golden")
        if "finite" in rec:
            state = "finite" if rec["finite"] else "NaN/Inf"
        elif one_side_text(rec) is not None:  # no counterpart: no difference of values
            state = one_side_text(rec)
        elif exact:
            state = "equal" if rec["bitwise_equal"] else "differs"
        else:
            state = rec["result"]
        line = f"    {rec['record']:<22} {state:<8}"
        for side, values in (("target", t), ("golden", g)):
            if not values:
                continue
            if side == "golden" and t:  # under the target's values
                line += f"\n    {'':<22} {'':<8}"
            line += f"  {side} {_record_text(values, rec.get(side + '_value'))}"
        tensors = _tensor_metrics_text(rec)
        if tensors:
            line += f"\n    {'':<22} {'':<8}  {tensors}"
        click.echo(line)
    for name, stack in (("target", f.target_stack), ("golden", f.golden_stack)):
        if stack:
            _print_stack(f"  {name} stack", stack, all_frames, "    ")


#: frames outside MindSpore shown per stack (the innermost included) unless ``--all-frames``
STACK_FRAMES_SHOWN = 6

_all_frames_opt = click.option("--all-frames", is_flag=True,
                               help="Print every stack frame (default: MindSpore's own frames folded, "
                                    f"at most {STACK_FRAMES_SHOWN} others).")


def _print_stack(title: str, frames: list, all_frames: bool, indent: str) -> None:
    """Print ``frames`` (stack.json lines, innermost first) under ``title``: every frame with
    ``all_frames``, else folded by :func:`_folded_stack`. ``show`` and ``first-diff`` use this."""
    if all_frames:
        click.echo(f"{title} (innermost first, all {len(frames)} frames):")
        lines = frame_lines(frames)
    else:
        click.echo(f"{title} (innermost first; MindSpore's own frames folded):")
        lines = _folded_stack(frames, STACK_FRAMES_SHOWN)
    for line in lines:
        click.echo(indent + line)


def _no_cell_path(entry: str) -> str:
    """What an empty Cell path means for ``entry``: a Cell that no recorded Cell calls, or another
    entry (API, Primitive, save()) that no recorded Cell encloses (at L1 no Cell is recorded)."""
    if entry.startswith("Cell."):
        return "(none: a top-level Cell)"
    return "(none: no recorded Cell encloses it)"


def _folded_stack(frames: list, limit: int) -> list:
    """The innermost frame of ``frames`` (stack.json lines, innermost first), then up to ``limit``
    frames in all outside the ``mindspore`` package, each run of MindSpore frames between them
    shown as one line; a last line counts the frames left out (``--all-frames`` shows them)."""
    out, folded, shown = [], 0, 0
    for k, frame in enumerate(frames):
        if shown == limit:
            out.append(f"... {len(frames) - k} more frame{'s' if len(frames) - k > 1 else ''} "
                       "(--all-frames shows every frame)")
            return out
        if k and f"{os.sep}mindspore{os.sep}" in frame.split(",", 1)[0]:
            folded += 1
            continue
        if folded:
            out.append(f"... {folded} MindSpore frame{'s' if folded > 1 else ''}")
            folded = 0
        out.append(frame_line(frame))
        shown += 1
    if folded:
        out.append(f"... {folded} MindSpore frame{'s' if folded > 1 else ''}")
    return out


@main.command("first-diff")
@click.argument("target", type=click.Path(exists=True))
@click.argument("golden", type=click.Path(exists=True), required=False)
@click.option("--exact", is_flag=True, help="Inputs/outputs agree only when bitwise equal.")
@_judging_opts
@_step_opt
@_rank_opt
@click.option("--json", "as_json", is_flag=True, help="Print the findings as JSON.")
@_all_frames_opt
@_bad_input
def first_diff(target, golden, exact, mode, step, rank, mapping, thresholds, ignore, as_json, all_frames):
    """Name the first difference of TARGET from GOLDEN (the entry where the runs part), per step and rank.

    In execution order, forward then backward: the first entry whose inputs agree (within the
    thresholds, or bitwise with --exact) and whose outputs do not, with its Cell path, both
    stacks and the numbers. Also the first NaN/Inf producer (inputs finite, output not) of each
    dump. Without GOLDEN only the NaN/Inf producer of TARGET is searched.

    Entries (or records) present on one side only because the dumps' modes differ (GRAPH_MODE
    against PyNative) are never named as the first difference: a note says what and why.

    Exit 0: the runs agree, or differ in precision only (no producer); 1: a first difference (a
    producer) was found; 2: bad input.
    """
    from msprobe.compare import first_divergence, level_notes, nan_producer
    from msprobe.compare.inputs import find_unpaired
    from msprobe.compare.output import json_safe

    diverged, agreed = [], []
    if golden is not None:
        diverged = first_divergence(target, golden, exact, agreed=agreed, mode=mode, step=step, rank=rank,
                                    mapping=mapping, thresholds=thresholds, ignore=ignore)
    nans = {"target": nan_producer(target, step, rank)}
    if golden is not None:
        nans["golden"] = nan_producer(golden, step, rank, run="golden")
    found_unpaired = find_unpaired(target, golden, step) if golden is not None else None
    unpaired = found_unpaired.text() if found_unpaired is not None else None
    if as_json:  # unpaired_steps: the step numbers per side (null without a golden dump)
        steps_alone = None if found_unpaired is None else found_unpaired.to_dict()
        click.echo(json.dumps(json_safe({"divergences": [f.to_dict() for f in diverged],
                                         "agreements": [a._asdict() for a in agreed],
                                         "nan_producers": {k: [f.to_dict() for f in v]
                                                           for k, v in nans.items()},
                                         "unpaired_steps": steps_alone}),
                                indent=2))
    else:
        if golden is not None and not diverged:
            texts = list(dict.fromkeys(a.text for a in agreed))
            for a in agreed if len(texts) > 1 else agreed[:1]:
                click.echo(f"step {a.step} {a.rank}: {a.text}" if len(texts) > 1 else a.text)
            partial = list(dict.fromkeys(n for a in agreed for n in (a.note, a.one_sided) if n))
            for note in level_notes(target, golden, step, rank) + partial:
                click.echo(f"  note: {note}")
        if diverged and agreed:  # the steps before (or beside) a difference that agree
            by_text = {}
            for a in agreed:
                by_text.setdefault(a.text, []).append(f"step {a.step} {a.rank}" if a.step is not None else a.rank)
            for text, where in by_text.items():
                click.echo(f"{', '.join(where)}: {text}")
            for note in dict.fromkeys(a.one_sided for a in agreed if a.one_sided):
                click.echo(f"  note: {note}")
        for f in diverged:
            _print_finding(f, f.label(), exact, all_frames)
        if unpaired:  # under the runs' agreement, or after the findings
            click.echo(f"{'' if diverged else '  '}note: {unpaired}")
        for side, found in nans.items():
            if not found:
                click.echo(f"{side}: no NaN/Inf producer (nor a watch-mode anomaly producer)")
            for f in found[:1]:
                _print_finding(f, f"{side}: {f.label()}", all_frames=all_frames)
            if len(found) > 1:
                click.echo(f"  ({side}: NaN/Inf producers in {len(found)} step/rank directories; "
                           f"--json lists all)")
    # a difference of precision alone (the runs agree within the lower precision) exits 0
    bad = [f for f in diverged if f.kind != "precision"] if golden is not None else nans["target"]
    sys.exit(EXIT_DIVERGED if bad else EXIT_OK)


@main.command()
@click.argument("dump", type=click.Path(exists=True))
@click.argument("entry")
@_step_opt
@_rank_opt
@_all_frames_opt
@_bad_input
def show(dump, entry, step, rank, all_frames):
    """Show one ENTRY of DUMP: its records, stack and Cell path (first matching step/rank; without
    --step, step/rank directories holding anomalies.json are searched first)."""
    from msprobe.compare.divergence import shown_cell_path
    from msprobe.format.naming import forward_of
    from msprobe.compare.inputs import anomaly_first, rank_number, resolve
    from msprobe.compare.records import Side
    from msprobe.dump import load_construct, load_stacks

    names = {}  # entry names of the directories searched, in execution order
    items = resolve(dump)
    chosen = [item for item in items if (step is None or item.step in step)
              and (rank is None or rank_number(item.rank) in rank)]
    if items and not chosen:  # the step/rank asked for is not in the dump: say that, not "not found"
        present = ", ".join(f"step {i.step} {i.rank}" if i.step is not None else i.rank for i in items[:8])
        asked = ", ".join(f"--{k} {','.join(map(str, v))}" for k, v in (("step", step), ("rank", rank)) if v)
        click.echo(f"msprobe: error: no step/rank directory of {dump} matches {asked}; present: {present}"
                   + (", ..." if len(items) > 8 else ""), err=True)
        sys.exit(EXIT_BAD_INPUT)
    for item in anomaly_first(chosen) if step is None else chosen:
        side = Side(item.path)
        if entry not in side.index:
            names.update(dict.fromkeys(side.names))
            continue
        click.echo(f"{entry}  (step {item.step}, {item.rank}: {item.path})")
        construct = load_construct(item.path)
        path = shown_cell_path(entry, construct)
        click.echo(f"Cell path: {' > '.join(path) if path else '(none)'}")
        for rec in side.records(side.index[entry]):
            desc = (f"{rec.dtype} {list(rec.shape)} Max={rec.stats[0]} Min={rec.stats[1]} "
                    f"Mean={rec.stats[2]} Norm={rec.stats[3]}" if rec.is_tensor
                    else f"{rec.kind} {rec.value!r}")
            extra = "".join(f" {k}={v}" for k, v in (("md5", rec.md5), ("data_name", rec.data_name)) if v)
            click.echo(f"  {rec.key:<24} {desc}{extra}")
        frames = load_stacks(item.path).get(forward_of(entry) or entry, [])
        if frames:
            _print_stack("stack", frames, all_frames, "  ")
        elif side.header.get("mode") == "GRAPH_MODE":
            click.echo("stack: none: this step ran in GRAPH_MODE, and compiled graphs record no Python stack")
        else:
            click.echo("stack: none recorded")
        return
    close = _close_names(entry, names)
    click.echo(f"msprobe: error: entry {entry!r} not found in {dump}"
               + (f"; did you mean: {', '.join(close)}?" if close else
                  f" ({len(names)} entries searched, none with a close name)"), err=True)
    sys.exit(EXIT_BAD_INPUT)


def _close_names(entry: str, names, limit: int = 5) -> list:
    """Up to ``limit`` of ``names`` like ``entry``: those that extend it (``Functional.relu`` ->
    ``Functional.relu.0.forward``), then those that contain it, ignoring case (``gelu`` ->
    ``Functional.gelu.0.forward``), in the given order, then the closest by ``difflib``."""
    ordered = list(names)
    out = [n for n in ordered if n.startswith(entry)][:limit]
    part = entry.lower()
    out += [n for n in ordered if part in n.lower() and n not in out][:limit - len(out)]
    out += [n for n in difflib.get_close_matches(entry, ordered, n=limit, cutoff=0.6) if n not in out]
    return out[:limit]


@main.command()
@click.argument("dump", type=click.Path(exists=True))
@click.option("--golden", type=click.Path(exists=True), help="Golden dump: colour nodes by compare result.")
@click.option("-o", "--output", "output", default="report.html", show_default=True,
              type=click.Path(dir_okay=False), help="HTML file to write.")
@_judging_opts
@click.option("--step", callback=_int_list, metavar="N",
              help="The step to show (one report is one step; default: the first step holding "
                   "anomalies.json, else the first step present).")
@click.option("--rank", callback=_int_list, metavar="R",
              help="The rank to show (default: the first rank present).")
@_bad_input
def report(dump, golden, output, mode, step, rank, mapping, thresholds, ignore):
    """Write a one-file HTML report of DUMP (one step/rank; unless --step/--rank: the first holding
    anomalies.json, else the first).

    The Cell tree from construct.json with each node's statistics (coloured by compare result
    with --golden), the first difference and the NaN/Inf producer one click away, and per entry
    its records, stack and source line. Opens from disk, no server.
    """
    from msprobe.compare.html import write_report

    for name, values in (("--step", step), ("--rank", rank)):
        if values and len(values) > 1:
            raise click.BadParameter(f"a report shows one step and rank; got {len(values)} values "
                                     f"{', '.join(map(str, values))}: write one report per value",
                                     param_hint=name)
    path = write_report(dump, output, golden=golden, mode=mode, step=step, rank=rank,
                        mapping=mapping, thresholds=thresholds, ignore=ignore)
    click.echo(f"report: {path}")


if __name__ == "__main__":
    main()
