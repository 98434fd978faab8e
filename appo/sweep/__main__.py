"""`python -m appo.sweep SWEEP_FILE`: see appo/sweep/cli.py."""

import sys

from appo.sweep.cli import main

if __name__ == "__main__":
    sys.exit(main())
