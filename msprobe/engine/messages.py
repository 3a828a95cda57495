"""Messages the user must see without configuring anything (the seed prints them).

MindSpore programs rarely configure Python logging, and the ``msprobe`` logger's INFO records are
dropped until someone does. :func:`announce` therefore logs on the ``msprobe`` logger when that
logging shows INFO records, and prints otherwise, as the seed does (``dump.json is at …``).
"""
from __future__ import annotations

import logging
import sys

logger = logging.getLogger("msprobe")


def announce(text: str) -> None:
    """Show ``text`` once: ``logger.info`` if configured logging shows it, else print to stdout."""
    if logger.isEnabledFor(logging.INFO) and logger.hasHandlers():
        logger.info("msprobe: %s", text)
    else:
        print(text, file=sys.stdout, flush=True)
