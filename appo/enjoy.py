"""`python -m appo.enjoy`: see appo/tools/enjoy.py."""

import sys

from appo.tools.enjoy import main

if __name__ == "__main__":
    sys.exit(main())
