"""`python -m appo.plot`: see appo/tools/plot.py."""

import sys

from appo.tools.plot import main

if __name__ == "__main__":
    sys.exit(main())
