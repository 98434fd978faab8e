"""The import names the package installs: `appo` and its subpackages only (envs/ is `appo.envs`, utils/ is
`appo.utils`), so a user's own `envs` or `utils` package neither shadows the trainer's nor is shadowed by it."""

import os
import pathlib
import shutil
import subprocess
import sys
import zipfile

import pytest

from tests.conftest import REPO, leaked_segments, shm_entries

pytestmark = pytest.mark.slow  # every test here starts a trainer or trains

# A user's project: its own utils/files.py (without the trainer's helpers) and an env folder named envs/ whose env
# imports from that utils package, given to the trainer as `envs.corridor:UserCorridor-v0`.
USER_PROJECT = {
    "utils/__init__.py": "",
    "utils/files.py": "def step_cost() -> float:\n    return 0.02\n",
    "envs/__init__.py": "",
    "envs/corridor.py": '''
import gymnasium as gym
import numpy as np

from utils.files import step_cost


class Corridor(gym.Env):
    observation_space = gym.spaces.Box(0.0, 1.0, (4,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos, self.t = 0, 0
        return np.eye(4, dtype=np.float32)[self.pos], {}

    def step(self, action):
        self.pos, self.t = max(0, min(3, self.pos + (1 if action else -1))), self.t + 1
        done = self.pos == 3
        return np.eye(4, dtype=np.float32)[self.pos], float(done) - step_cost(), done, self.t >= 20, {}


gym.register("UserCorridor-v0", entry_point=Corridor)
''',
}
RUN = ["--env=envs.corridor:UserCorridor-v0", "--train_for_env_steps=3000", "--num_workers=1",
       "--num_envs_per_worker=4", "--decorrelate_envs_on_one_worker=False", "--device=cpu"]


def write_user_project(folder: pathlib.Path) -> None:
    for name, text in USER_PROJECT.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)


def train_from(folder: pathlib.Path, env: dict[str, str]) -> None:
    before = shm_entries()
    command = [sys.executable, "-m", "appo.train", f"--train_dir={folder / 'train_dir'}", "--experiment=user", *RUN]
    result = subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=150, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert (folder / "train_dir" / "user" / "done").exists()
    assert leaked_segments(before) == set()


@pytest.mark.timeout(180)
def test_training_from_a_project_with_its_own_utils_and_envs(tmp_path):
    write_user_project(tmp_path)
    train_from(tmp_path, dict(os.environ))


@pytest.mark.timeout(300)
def test_a_built_wheel_installs_only_appo_and_runs_from_another_folder(tmp_path):
    source = tmp_path / "source"  # a copy, so that building leaves nothing in the repository
    for name in ("appo", "envs", "utils"):
        shutil.copytree(os.path.join(REPO, name), source / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "setup.cfg", "README.md"):
        shutil.copy(os.path.join(REPO, name), source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path / "dist"), str(source)], check=True, capture_output=True, timeout=200)
    wheel = next((tmp_path / "dist").glob("appo-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert {name.split("/")[0] for name in names if name.endswith(".py")} == {"appo"}
    # Every package folder of the repository is in the wheel (pyproject lists them one by one).
    for folder, package in (("appo", "appo"), ("envs", "appo/envs"), ("utils", "appo/utils")):
        for init in pathlib.Path(REPO, folder).rglob("__init__.py"):
            assert f"{package}/{init.relative_to(pathlib.Path(REPO, folder)).as_posix()}" in names

    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)  # what pip does with a pure-Python wheel
    project = tmp_path / "project"
    write_user_project(project)
    env = {**os.environ, "PYTHONPATH": str(site)}
    where = subprocess.run([sys.executable, "-c", "import appo.envs, appo.utils; print(appo.envs.__file__)"],
                           cwd=project, capture_output=True, text=True, env=env, timeout=60)
    assert where.stdout.strip() == str(site / "appo" / "envs" / "__init__.py"), where.stderr
    train_from(project, env)
