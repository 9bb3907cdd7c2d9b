"""`python -m specpilot_bench` runs the `specpilot-bench` command."""

import sys

from .cli import main

sys.exit(main())
