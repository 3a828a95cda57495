"""What the training workers of tests/scripts share: the command line every one of them starts with
and the digest of a step's tensors that the tests compare between a run with the tool and one without."""
from __future__ import annotations

import argparse
import hashlib


def digest(tensors) -> str:
    """SHA-256 of the raw bytes of ``tensors`` (an iterable of MindSpore Tensors), in order: equal
    digests mean bit-identical gradients or parameters."""
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.asnumpy().tobytes())
    return h.hexdigest()


def training_parser() -> argparse.ArgumentParser:
    """The arguments ``MODE TOOL DUMP_PATH [--level L0]``: MindSpore mode (``graph`` | ``pynative``),
    the tool ``on`` or ``off``, the dump path, the level; a worker adds its own."""
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["graph", "pynative"])
    ap.add_argument("tool", choices=["on", "off"])
    ap.add_argument("dump_path")
    ap.add_argument("--level", default="L0")
    return ap
