"""`python -m appo.versus`: see appo/tools/versus.py."""

import sys

from appo.tools.versus import main

if __name__ == "__main__":
    sys.exit(main())
