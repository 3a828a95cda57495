"""A virtualenv of its own for mindformers 2.0.0 and mindcv 0.3.0 (third-party model code for the
invisibility test).

mindformers 2.0.0 is the last release that installs beside ``mindspore==2.10.0``, and only this way:
``pip install --no-deps mindformers==2.0.0``, then its requirements by hand with ``pyarrow<21`` (its
own pin needs NumPy 2) and without ``hyper-parallel`` (not on the package registry; the worker puts
a stand-in module on ``sys.path``). mindcv 0.3.0 is installed the same way, ``--no-deps``: what it
requires (NumPy, PyYAML, tqdm) is already there, and its metadata names no MindSpore version.
``numpy<2`` and ``mindspore==2.10.0`` are on every install command line so pip cannot move them.
msprobe itself is installed editable from this checkout, with its dependencies.

The venv is created once at ``<repo>/.venv-mindformers`` (~80-640 s, ~3.4 GB) and reused while its
marker file exists; the marker is written last, so an interrupted creation is redone from scratch. The
marker lists the third-party packages and msprobe's runtime requirements it was made with: when they
change, only they are installed into the reused venv.

    python tests/thirdparty_venv.py        # create (or reuse) it and print its python
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV = os.environ.get("MSPROBE_MINDFORMERS_VENV", os.path.join(ROOT, ".venv-mindformers"))
MARKER = ".msprobe-complete"

PINS = ["mindspore==2.10.0", "numpy<2"]
MINDFORMERS = "mindformers==2.0.0"
MINDCV = "mindcv==0.3.0"
#: the model packages, installed with --no-deps (their requirements are installed first, by hand)
MODEL_PACKAGES = [MINDFORMERS, MINDCV]
#: mindformers 2.0.0's requirements, except pyarrow (pinned below 21 for NumPy 1) and hyper-parallel
MINDFORMERS_REQUIREMENTS = [
    "setuptools>=83", "sentencepiece>=0.2.1", "ftfy>=6.1.1", "regex", "tqdm", "pyyaml", "jieba",
    "rouge_chinese", "nltk==3.9.1", "mindpet==1.0.4", "opencv-python-headless", "tokenizers",
    "tiktoken", "jinja2", "setproctitle", "safetensors", "tensorboardX", "deprecated", "pybind11",
    "transformers==4.57.1", "datasets>=4.0.0", "pyarrow<21",
]
#: msprobe's own runtime dependencies (it is installed with --no-deps; see pyproject.toml)
MSPROBE_REQUIREMENTS = ["pydantic>=2.5,<3", "PyYAML>=6", "orjson>=3.9", "jsonschema>=4.18", "zlib-ng>=1.0"]


def python_of(venv: str = VENV) -> str:
    return os.path.join(venv, "bin", "python")


def is_ready(venv: str = VENV) -> bool:
    return os.path.isfile(os.path.join(venv, MARKER)) and os.path.isfile(python_of(venv))


def _pip(venv: str, *args: str) -> None:
    cmd = [python_of(venv), "-m", "pip", "install", "-q", *args]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({result.returncode}):\n"
                           f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}")


def _base_python() -> str:
    """The interpreter behind the running one (a venv's python makes a venv of its base)."""
    return getattr(sys, "_base_executable", None) or sys.executable


def ensure_venv(venv: str = VENV, repo: str = ROOT) -> tuple[str, float]:
    """Create the mindformers venv unless it is complete already.

    Returns:
        ``(path of its python, seconds spent creating it)`` (0.0 when it was reused).

    Raises:
        RuntimeError: an install command failed (its output is in the message).
    """
    if is_ready(venv):
        with open(os.path.join(venv, MARKER), encoding="utf-8") as f:
            made_with = f.read()
        if made_with != _marker_text():  # a package or msprobe's requirements changed since then
            _pip(venv, *PINS, *MSPROBE_REQUIREMENTS)
            _pip(venv, "--no-deps", *MODEL_PACKAGES)
            _write_marker(venv)
        return python_of(venv), 0.0
    began = time.perf_counter()
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([_base_python(), "-m", "venv", venv], check=True)
    _pip(venv, *PINS, *MINDFORMERS_REQUIREMENTS, *MSPROBE_REQUIREMENTS)  # one resolution
    _pip(venv, "--no-deps", *MODEL_PACKAGES, "-e", repo)
    _write_marker(venv)
    return python_of(venv), time.perf_counter() - began


def _marker_text() -> str:
    return f"{' '.join(MODEL_PACKAGES)} {' '.join(PINS)}\n{' '.join(MSPROBE_REQUIREMENTS)}\n"


def _write_marker(venv: str) -> None:
    with open(os.path.join(venv, MARKER), "w", encoding="utf-8") as f:
        f.write(_marker_text())


if __name__ == "__main__":
    python, seconds = ensure_venv()
    print(f"{python} (created in {seconds:.0f} s)" if seconds else f"{python} (reused)")
