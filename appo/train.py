"""`python -m appo.train --env=CartPole-v1 --experiment=NAME`: train, or resume, an experiment (appo/launch.py).
From Python: `from appo import train`."""

import sys

from appo.launch import main

if __name__ == "__main__":
    sys.exit(main())
