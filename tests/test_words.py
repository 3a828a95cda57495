"""Code, docstrings, tests and docs refer only to things a reader of this repository can open: no
section numbers of a specification the repository does not hold, no ids of hand-made test-case lists,
no issue numbers, no notes about who worked on it when. State the rule itself, or cite the seed
document's section heading (seed: "...") or the MindSpore API. No MindSpore needed."""
from __future__ import annotations

import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: trees and files checked (text files only)
CHECKED = ("msprobe", "tests", "docs", "benchmarks", "examples", "README.md")
TEXT_SUFFIXES = (".py", ".md", ".yaml", ".yml", ".toml", ".txt", ".html", ".j2", ".c", ".cfg")
SKIPPED_DIRS = ("data", "__pycache__")  # tests/data: files written by other tools

#: (what it is, pattern) for references to documents this repository does not have
FORBIDDEN = (
    ("a section sign", re.compile("\u00a7")),
    ("a numbered section of a spec", re.compile(r"\bspec(?:ification)?\s+\d+(?:\.\d+)*\b", re.I)),
    ("the reference behaviour notes", re.compile(r"reference_behaviou?r")),
    ("the hand-made case list", re.compile(r"\bcases/(?:README)?")),
    ("a case id", re.compile(r"\b[A-D]\d{2}\b|\b[A-D]\d{1,2}(?=[:/,)]|\s*-\s*[A-D]\d)")),
    ("a case id in a test name", re.compile(r"\btest_[a-d]\d{1,2}_")),
    ("a numbered case", re.compile(r"\bcase\s+#?\d+\b|\bcase\s+[A-D]\d+\b", re.I)),
    ("an issue number", re.compile(r"\bissues?\s*#?\s*\d+\b|#\d+\s+item\b", re.I)),
    ("a numbered stop of a review",
     re.compile(r"\bstop\s+#?\d+\b(?!\s*(?:steps?|ms|s\b|seconds?|calls?))", re.I)),
    ("the team's roles", re.compile(r"\bthe lead\b", re.I)),
    ("a work session", re.compile(r"\b(?:last|previous|this|next|earlier|later|current)\s+session\b", re.I)),
    ("notes outside the repository", re.compile(r"\bSTYLE\.md\b|mindspore_cpu_notes|/work/shared\b")),
)


def _checked_files():
    own = os.path.abspath(__file__)
    for top in CHECKED:
        path = os.path.join(ROOT, top)
        if os.path.isfile(path):
            yield path
            continue
        for directory, dirs, files in os.walk(path):
            dirs[:] = [d for d in dirs if d not in SKIPPED_DIRS]
            for name in files:
                full = os.path.join(directory, name)
                if name.endswith(TEXT_SUFFIXES) and full != own:
                    yield full


def find_references(text: str) -> list:
    """``[(line number, what, matched text)]`` of every forbidden reference in ``text``."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for what, pattern in FORBIDDEN:
            for match in pattern.finditer(line):
                found.append((number, what, match.group(0)))
    return found


@pytest.mark.parametrize("line", [
    "see spec \u00a74.7", "(spec 4.2)", "reference_behaviour.md", "../shared/cases/README.md",
    "# B22: budget", "Cases B01, B03, B12-B17", "def test_b12_eval_loop():", "(case 3)", "case B11",
    "issue 5", "issue #12", "see issue6 item 6", "review stop 10", "ask the lead",
    "measured at the end of the last session", "lesson in STYLE.md", "mindspore_cpu_notes.md",
])
def test_each_kind_of_reference_is_found(line):
    assert find_references(line), line


@pytest.mark.parametrize("line", [
    '@pytest.fixture(scope="session")', "spec = BY_NAME[name]", "NetSpec(...)", "float16 and bf16",
    "'<E2'", "Bench max", "stop()", "stop 2 steps later", "MD5", "ops.Conv2D", "sha256", "int64",
    "the leading dimension", "step 10 of 20",
])
def test_ordinary_words_are_not_references(line):
    assert find_references(line) == [], line


def test_the_repository_has_no_references_to_documents_it_does_not_have():
    found = []
    for path in _checked_files():
        with open(path, encoding="utf-8", errors="replace") as f:
            for number, what, text in find_references(f.read()):
                found.append(f"{os.path.relpath(path, ROOT)}:{number}: {what}: {text!r}")
    assert found == [], "\n".join(found)
