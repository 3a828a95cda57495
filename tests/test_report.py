"""msprobe report: the one-file HTML report rendered in a real headless Chromium (Debian package
``chromium``; .ci/run installs it). The DOM is read after the page's script ran (``--dump-dom``)."""
from __future__ import annotations

import os
import shutil
import subprocess
from html.parser import HTMLParser

import pytest

from compare_dumps import make_dump
from msprobe.compare.html import write_report

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (apt-get install chromium)")


def chromium(tmp_path, url: str, *extra) -> subprocess.CompletedProcess:
    profile = tmp_path / "chromium-profile"
    args = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            f"--user-data-dir={profile}", "--window-size=1400,1000", *extra, url]
    return subprocess.run(args, capture_output=True, text=True, timeout=120)


class Dom(HTMLParser):
    """The rendered DOM's elements with their attributes and open ``details`` ancestors."""

    def __init__(self, text: str):
        super().__init__()
        self.by_id, self.body, self._stack = {}, {}, []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "body":
            self.body = attrs
        if "id" in attrs:
            self.by_id[attrs["id"]] = (tag, attrs, [a for t, a in self._stack if t == "details"])
        if tag not in ("meta", "br", "input", "img", "link"):
            self._stack.append((tag, attrs))

    def handle_endtag(self, tag):
        while self._stack:
            if self._stack.pop()[0] == tag:
                break


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    root = tmp_path_factory.mktemp("rep")
    return {"base": make_dump(root, "base"), "factor": make_dump(root, "factor", factor=2.5),
            "nan": make_dump(root, "nan", nan=True)}


def _node_id(dom: Dom, name: str) -> str:
    return next(i for i, (tag, attrs, _) in dom.by_id.items() if attrs.get("data-name") == name)


def test_report_opens_the_first_divergence_in_chromium(dumps, tmp_path):
    path = write_report(dumps["factor"], str(tmp_path / "report.html"), golden=dumps["base"])
    static = Dom(open(path, encoding="utf-8").read())
    link = static.by_id["goto-divergence"][1]["href"]
    target = link[1:]
    assert static.by_id[target][1]["data-name"] == "Mint.mul.0.forward"
    proc = chromium(tmp_path, f"file://{path}{link}", "--dump-dom")
    assert proc.returncode == 0, proc.stderr[-2000:]
    dom = Dom(proc.stdout)
    assert dom.body.get("data-ready") == "1"                     # the page's script ran
    assert dom.body.get("data-focused") == target
    tag, attrs, ancestors = dom.by_id[target]
    assert "focus" in attrs["class"].split() and "open" in attrs
    # the node sits in the Scale Cell's subtree, which the script opened
    assert [a["data-name"] for a in ancestors] == ["Cell.scale.Scale.forward.0"]
    assert all("open" in a for a in ancestors)
    # colours by compare result: the changed call is an error and the source, earlier Cells pass
    assert "res-error" in attrs["class"].split()
    assert "res-pass" in dom.by_id[_node_id(dom, "Cell.fc1.Dense.forward.0")][1]["class"].split()
    # without a fragment nothing is forced open
    plain = Dom(chromium(tmp_path, f"file://{path}", "--dump-dom").stdout)
    assert plain.body.get("data-ready") == "1" and "data-focused" not in plain.body
    assert "open" not in plain.by_id[target][1]
    html = open(path, encoding="utf-8").read()
    assert "compare_dumps.py" in html and "source:" in html         # per entry source line and stack
    assert "<script src" not in html and "http" not in html.split("<main>")[1]   # nothing fetched


def test_report_nan_producer_and_screenshot(dumps, tmp_path):
    path = write_report(dumps["nan"], str(tmp_path / "nan.html"))
    static = Dom(open(path, encoding="utf-8").read())
    link = static.by_id["goto-nan"][1]["href"]
    assert static.by_id[link[1:]][1]["data-name"] == "Functional.sqrt.0.forward"
    shot = tmp_path / "nan.png"
    proc = chromium(tmp_path, f"file://{path}{link}", f"--screenshot={shot}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    with open(shot, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert os.path.getsize(shot) > 20_000                          # a rendered page, not a blank one
    dom = Dom(chromium(tmp_path, f"file://{path}{link}", "--dump-dom").stdout)
    tag, attrs, _ = dom.by_id[link[1:]]
    assert "open" in attrs and dom.body.get("data-focused") == link[1:]
