"""A user's launcher: register an env by name, then run the trainer (workers inherit the registration)."""

import sys

import tests.user_env  # noqa: F401  registers "my_corridor"
from appo.train import main

if __name__ == "__main__":
    sys.exit(main())
