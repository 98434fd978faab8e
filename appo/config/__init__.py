"""Configuration: the flag table and the frozen `Config` (flags.py), parsing, resume and cfg.json (cfg.py), the
checks (checks.py), the names --encoder accepts (encoders.py), the defaults chosen from the env (auto.py), each role's
view (views.py), the hyper-parameters PBT may change (hyperparams.py) and the process graph's shape (topology.py).

Torch-free: the runner and the actor workers read it.
"""

from appo.config.checks import ConfigError
from appo.config.flags import Config

__all__ = ["Config", "ConfigError"]
