"""Journal lines of a drain recipe, made by one compiled function per recipe.

A compiled graph run again reports the same calls, so the journal lines of a drain that starts a step
(:class:`msprobe.capture.cells.graph_cell._Recipe`) differ from step to step only in the statistics
slots of the probes' arrays (and the leaves of the Cells' parameters read at ``start()``). Instead of
making records and turning each into its line (``Runtime.queue_graph_records``), a recipe compiles its
lines once into a Python function whose body is one list display of dict displays: the entry names,
keys and ``construct.json`` parents are constants, the slots and parameters its arguments. A call makes
every line of the drain with no per-record Python work, and the lines are those the records make, key
for key in the same order (``tests/test_graph_probes.py`` compares the files of both ways).
"""
from __future__ import annotations


class Lines:
    """The journal lines of a recipe's ``steps`` (:class:`msprobe.capture.cells.graph_cell._Recipe`) as
    ``Runtime.queue_graph_records`` makes them from the recipe's records.

    Args:
        steps: ``[(body, entry, items)]``: ``body`` ``None``: ``entry`` is a ``(name, parent)``
            ``construct.json`` edge; ``True``: a stack use of ``entry`` with ``items``
            (``[(key, spec)]``) as its body; ``False``: one ``data[entry][key]`` item. A ``spec`` is
            ``("s", places)`` (a list of slots, ``-1``: ``None``), ``("d", keys, places)`` (``[{key:
            slot}]``), ``("n", tree)`` (nested lists of slot numbers, ``-1``: ``None``, and
            ``("v", type name, value)``: a scalar's leaf), ``("p", cell id)`` (a copy of that Cell's parameter leaves) or ``("c", type)``
            (an empty ``dict`` or ``list``).
        extra_info: the config's ``extra_info``: edges and stack uses are journaled (else only the
            items, one ``key_line`` each).

    Attributes:
        asked: how many values the lines record (the runtime's count of values handed to it).
        first_stack: index of the first stack-use line (its stack's frames line goes before it the
            first time the step uses the stack), or ``None``.
        order: the slot numbers in the order the records list their slots.
    """

    def __init__(self, steps: list, extra_info: bool):
        self.asked, self.first_stack, self.order = 0, None, []
        constants: list = []
        where: dict = {}

        def const(value) -> str:
            key = (type(value), value)
            if key not in where:
                where[key] = len(constants)
                constants.append(value)
            return f"K[{where[key]}]"

        def value_of(spec) -> str:
            tag = spec[0]
            if tag == "s":
                self.order.extend(i for i in spec[1] if i >= 0)
                return "[" + ", ".join("None" if i < 0 else f"S[{i}]" for i in spec[1]) + "]"
            if tag == "d":
                self.order.extend(spec[2])
                return "[{" + ", ".join(f"{const(k)}: S[{i}]" for k, i in zip(spec[1], spec[2])) + "}]"
            if tag == "p":
                return f"dict(P[{const(spec[1])}])"
            if tag == "n":
                return tree(spec[1])
            return "{}" if spec[1] is dict else "[]"

        def tree(item) -> str:
            if type(item) is list:
                return "[" + ", ".join(tree(i) for i in item) + "]"
            if type(item) is tuple:  # a scalar's leaf
                return f"{{'type': {const(item[1])}, 'value': {const(item[2])}}}"
            if item < 0:
                return "None"
            self.order.append(item)
            return f"S[{item}]"

        lines: list = []
        for body, entry, items in steps:
            if body is None:
                if extra_info:
                    name, parent = entry
                    lines.append(f"{{'c': {const(name)}, 'p': {const(parent)}}}")
                continue
            self.asked += len(items)
            values = [(key, value_of(spec)) for key, spec in items]
            if body and extra_info:
                if self.first_stack is None:
                    self.first_stack = len(lines)
                if not values:
                    lines.append(f"{{'e': {const(entry)}, 'stack': sid}}")
                    continue
                inner = ", ".join(f"{const(key)}: {value}" for key, value in values)
                lines.append(f"{{'e': {const(entry)}, 'stack': sid, 'v': {{{inner}}}}}")
            else:
                lines.extend(f"{{'e': {const(entry)}, 'k': {const(key)}, 'v': {value}}}" for key, value in values)
        source = "def make(S, P, sid):\n    return [" + ",\n        ".join(lines) + "]\n"
        namespace = {"K": tuple(constants), "dict": dict}
        # the source holds no recorded text: names, keys and parents are read from K by index
        exec(compile(source, "<msprobe recipe lines>", "exec"), namespace)  # noqa: S102
        #: ``make(slots, parameter leaves by Cell id, stack id)`` -> the lines
        self.make = namespace["make"]
