"""``python -m experiments.report``: see :mod:`experiments.report`."""

import sys

from experiments.report.build import main

sys.exit(main())
