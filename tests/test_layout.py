"""The layout's rules, checked: which packages may import torch, and that no import runs back up the layers."""

import ast
import pathlib
import subprocess
import sys

import pytest

from tests.conftest import REPO, source_file

ROOT = pathlib.Path(REPO)
# Packages (or modules) the runner, the actors or a Ray node import: they must never load torch.
TORCH_FREE = ["appo.config", "appo.memory", "appo.workers", "appo.sampling", "appo.population", "appo.run",
              "appo.messages", "appo.spaces", "appo.hooks", "appo.train", "appo.launch", "appo.preflight", "appo.envs",
              "appo.utils", "appo.tracking", "appo.sweep"]
# The one module of a torch-free package that serves torch: inference runs the model.
USES_TORCH = {"appo.sampling.inference_worker"}


def modules_of(package: str) -> list[str]:
    path = pathlib.Path(source_file(package))
    if path.name != "__init__.py":
        return [package]
    path = path.parent
    return sorted(".".join((package, *p.relative_to(path).with_suffix("").parts)).removesuffix(".__init__")
                  for p in path.rglob("*.py"))


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("package", TORCH_FREE)
def test_torch_free_packages_never_import_torch(package):
    modules = [m for m in modules_of(package) if m not in USES_TORCH]
    code = (f"import sys, importlib\nfor m in {modules!r}:\n    importlib.import_module(m)\n"
            "    assert 'torch' not in sys.modules, m + ' imported torch'\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=100)
    assert result.returncode == 0, result.stderr


def test_the_inference_worker_is_the_torch_user_of_sampling():
    source = (ROOT / "appo/sampling/inference_worker.py").read_text()
    assert "import torch" in source  # the exception above is real, not a stale entry


# Lower layers never import higher ones: memory, config and the env helpers at the bottom; population (which reads the
# flags and PBT's bounds), workers (what a worker process is and is handed) and tracking (where the summaries go) on
# them; sampling and learning, whose workers those are, above; the runner, the tools and sweeps on top.
LAYERS = {"appo.memory": 0, "appo.config": 0, "appo.envs": 0, "appo.spaces": 0, "appo.messages": 0,
          "appo.population": 1, "appo.workers": 1, "appo.tracking": 1,
          "appo.sampling": 2, "appo.learning": 2,
          "appo.run": 3, "appo.tools": 3, "appo.sweep": 3}
# Packages of one layer that stay apart, but for the listed modules: inference (a sampling module) runs the
# learner's model; nothing in learning imports sampling.
APART = [("appo.sampling", "appo.learning", USES_TORCH)]


def within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def layer_of(module: str) -> int | None:
    for prefix, layer in LAYERS.items():
        if within(module, prefix):
            return layer
    return None


def imported_modules(node: ast.AST) -> list[str]:
    """The appo modules one import statement names: `from appo.x import y`, `import appo.x`."""
    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        names = [node.module]
    elif isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        return []
    return [name for name in names if name.startswith("appo.")]


def source_trees() -> list[tuple[str, ast.AST]]:
    """(module name, its syntax tree) for every module of appo/ and envs/ (installed as appo.envs)."""
    trees = []
    for folder, package in (("appo", "appo"), ("envs", "appo.envs")):
        for path in (ROOT / folder).rglob("*.py"):
            module = ".".join((package, *path.relative_to(ROOT / folder).with_suffix("").parts))
            trees.append((module, ast.parse(path.read_text())))
    return trees


def appo_imports() -> list[tuple[str, str]]:
    """(importing module, imported module) for every import of appo in appo/ and envs/: the lazy ones inside functions
    too (ast.walk visits every statement), which is how a role's class is loaded (appo/run/roles.py)."""
    return [(module, target) for module, tree in source_trees() for node in ast.walk(tree)
            for target in imported_modules(node)]


def test_no_relative_imports():
    """Every import names its module in full, so that the edges above (and grep) see it."""
    relative = [module for module, tree in source_trees()
                if any(isinstance(node, ast.ImportFrom) and node.level for node in ast.walk(tree))]
    assert relative == []


def test_every_role_class_is_an_import_edge():
    """A role's class is loaded by a plain (lazy) import that the layering checks see, not by a name in a string."""
    from appo.run import roles
    from appo.workers.roles import WorkerRole

    edges = set(appo_imports())
    for role in (value for value in vars(roles).values() if isinstance(value, roles.Role)):
        cls = role.load()
        assert issubclass(cls, WorkerRole), role.name
        assert ("appo.run.roles", cls.__module__) in edges, role.name


def test_no_import_runs_back_up():
    offences = []
    for module, target in appo_imports():
        own, imported = layer_of(module), layer_of(target)
        if own is not None and imported is not None and imported > own:
            offences.append(f"{module} imports {target}")
    assert offences == []


def test_packages_of_one_layer_stay_apart():
    offences = []
    for module, target in appo_imports():
        for first, second, allowed in APART:
            crosses = ((within(module, first) and within(target, second))
                       or (within(module, second) and within(target, first)))
            if crosses and module not in allowed:
                offences.append(f"{module} imports {target}")
    assert offences == []
