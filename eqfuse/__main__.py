"""`python -m eqfuse ...`: the same command as `eqfuse ...`."""

import sys

from .cli import main

sys.exit(main())
