"""Environment creation shared by the runner (to read spaces) and actor workers (to step envs)."""

from appo.envs.catch import CatchEnv
from appo.envs.duel import make_duel_env
from appo.envs.minatar import MAKERS as MINATAR_MAKERS
from appo.envs.multi_agent import make_multi_agent_env
from appo.envs.partially_observed import make_masked_cartpole
from appo.envs.registry import EnvError, EnvInfo, env_info, make_env, register_env
from appo.envs.shaped_mountain_car import make_shaped_mountain_car
from appo.envs.synthetic import make_cpu_env, make_sleep_env

register_env("sleep_env", make_sleep_env)
register_env("cpu_env", make_cpu_env)
register_env("coop_multi_agent", make_multi_agent_env)
register_env("mountain_car_shaped", make_shaped_mountain_car)
register_env("duel", make_duel_env)
register_env("cartpole_masked", make_masked_cartpole)
register_env("catch", CatchEnv)
for _name, _make in MINATAR_MAKERS.items():
    register_env(_name, _make)

__all__ = ["EnvError", "EnvInfo", "env_info", "make_env", "register_env"]
