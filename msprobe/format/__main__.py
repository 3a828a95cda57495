"""``python -m msprobe.format DIR_OR_FILE...``: validate dump files (see :mod:`msprobe.format.validate`)."""
import sys

from msprobe.format.validate import main

sys.exit(main())
