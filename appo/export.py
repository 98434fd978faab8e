"""`python -m appo.export`: see appo/tools/export.py."""

import sys

from appo.tools.export import main

if __name__ == "__main__":
    sys.exit(main())
