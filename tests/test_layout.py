"""The layout's rules, checked: which packages may import torch, and that no import runs back up the layers."""

import ast
import pathlib
import subprocess
import sys

import pytest

from tests.conftest import REPO, source_file

ROOT = pathlib.Path(REPO)
# Packages (or modules) the runner, the actors or a Ray node import: they must never load torch.
TORCH_FREE = ["appo.config", "appo.memory", "appo.sampling", "appo.population", "appo.run", "appo.messages",
              "appo.spaces", "appo.hooks", "appo.train", "appo.envs", "appo.utils"]
# The one module of a torch-free package that serves torch: inference runs the model.
USES_TORCH = {"appo.sampling.inference_worker"}


def modules_of(package: str) -> list[str]:
    path = pathlib.Path(source_file(package))
    if path.name != "__init__.py":
        return [package]
    path = path.parent
    return sorted(".".join((package, *p.relative_to(path).with_suffix("").parts)).removesuffix(".__init__")
                  for p in path.rglob("*.py"))


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


# Lower layers never import higher ones: memory and config sit under sampling and learning, which sit under run.
LAYERS = {"appo.memory": 0, "appo.config": 0, "appo.population": 0, "appo.spaces": 0, "appo.messages": 0,
          "appo.sampling": 1, "appo.learning": 1, "appo.run": 2, "appo.tools": 2}


def layer_of(module: str) -> int | None:
    for prefix, layer in LAYERS.items():
        if module == prefix or module.startswith(prefix + "."):
            return layer
    return None


def test_no_import_runs_back_up():
    offences = []
    for path in (ROOT / "appo").rglob("*.py"):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        own = layer_of(module)
        if own is None:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("appo."):
                target = layer_of(node.module)
                if target is not None and target > own:
                    offences.append(f"{module} imports {node.module}")
    assert offences == []
