"""`python -m eqfuse ...`: the same command as `eqfuse ...`."""

import sys

from eqfuse.cli.main import main

sys.exit(main())
