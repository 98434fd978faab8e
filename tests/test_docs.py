"""The documentation a user navigates, README.md and docs/*.md: every command it shows runs, every link leads somewhere.

- Every ```bash block of README.md and docs/*.md (the guides, docs/guide_*.md, are tests/test_guides.py's) is run as
  a reader would, command by command and in order, in one temporary folder per page, so later commands use what
  earlier ones trained (the README's `appo.enjoy` plays its first run). Commands are shortened, not changed: a
  training run's `--train_for_env_steps` is divided by SHORTEN (a run without one gets SHORT_BUDGET; a benchmark its
  `--benchmark_env_steps`), `scripts/time_to_solve.py` does one run. `pip install` steps are checked as done rather
  than re-run (the pinned torch installed, this checkout installed in editable mode, every requirement of the named
  extras present), and `python -m pytest` is one of the two test commands (the full one is what CI runs, `.ci/run`).
  A command no rule below knows fails the test: give it a rule, or show it in a ```text block (commands that run for
  minutes belong there).
- A ```python block of these pages is a fragment (`my_package` is the reader's): it must compile.
- Every relative link points at a file that exists, and a `#anchor` at a heading of that page; docs/index.md links
  every page under docs/; the README stays a short page.
"""

import glob
import importlib.metadata
import os
import re
import shlex

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from tests.conftest import REPO, leaked_segments, shm_entries
from tests.test_guides import bash_commands, localized, run

ALL_PAGES = ["README.md"] + sorted(f"docs/{os.path.basename(p)}" for p in glob.glob(os.path.join(REPO, "docs", "*.md")))
PAGES = [page for page in ALL_PAGES if not os.path.basename(page).startswith("guide_")]  # guides: tests/test_guides.py
FENCE = re.compile(r"^[ \t]*```(\w*)[^\n]*\n(.*?)^[ \t]*```[ \t]*$", re.MULTILINE | re.DOTALL)
SHORTEN = 100  # a documented --train_for_env_steps=N runs N // SHORTEN steps (at least MIN_BUDGET)
SHORT_BUDGET, MIN_BUDGET = 10_000, 2_000
README_MAX_LINES = 100  # one or two screens
# The suite run with another torch release than the README's on purpose (noxfile.py's full sessions say which).
TORCH_UNDER_TEST = "APPO_TORCH_UNDER_TEST"
QUICK_CHECK, FULL_SUITE = "python -m pytest -q", "python -m pytest -q --full"  # the second is CI's (.ci/run)


def read(page: str) -> str:
    with open(os.path.join(REPO, page)) as f:
        return f.read()


def fenced(page: str, language: str) -> list[str]:
    """The page's blocks in that language, in order, each dedented by its fence's indentation."""
    found = []
    for match in FENCE.finditer(read(page)):
        if match.group(1) == language:
            indent = len(match.group(0)) - len(match.group(0).lstrip(" \t"))
            found.append("\n".join(line[indent:] for line in match.group(2).splitlines()))
    return found


# ---------------------------------------------------------------- how each documented command is run
def installed_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["project"]


def check_requirements(texts: list[str], seen: set[str]) -> None:
    """Each requirement that applies on this Python is installed in a version it allows; `appo[...]` is followed."""
    for requirement in map(Requirement, texts):
        if requirement.marker is not None and not requirement.marker.evaluate():
            continue
        if requirement.name == "appo":
            check_extras(set(requirement.extras), seen)
            continue
        version = installed_version(requirement.name)
        assert version is not None, f"{requirement} is not installed"
        assert requirement.specifier.contains(Version(version).public, prereleases=True), (str(requirement), version)


def check_extras(extras: set[str], seen: set[str]) -> None:
    optional = pyproject()["optional-dependencies"]
    for extra in sorted(extras - seen):
        assert extra in optional, f"appo has no extra {extra!r}"
        seen.add(extra)
        check_requirements(optional[extra], seen)


def check_pip_install(args: list[str]) -> str:
    """`pip install X` checked as done: the same version of a pinned package, or this checkout with its extras."""
    assert args[:2] == ["pip", "install"], args
    if args[2] == "-e":
        match = re.fullmatch(r"\.(?:\[([\w,]+)\])?", args[3])
        assert match and len(args) == 4, f"unexpected pip install: {args}"
        urls = [dist.read_text("direct_url.json") or "" for dist in importlib.metadata.distributions(name="appo")]
        editable = [url for url in urls if '"editable": true' in url and f"file://{os.path.realpath(REPO)}" in url]
        assert editable, f"appo is not installed in editable mode from {REPO}: {urls}"
        check_requirements(pyproject()["dependencies"], set())
        check_extras(set(filter(None, (match.group(1) or "").split(","))), set())
        return "appo installed in editable mode from this checkout"
    for spec in args[2:]:
        requirement = Requirement(spec)
        if requirement.name == "torch" and os.environ.get(TORCH_UNDER_TEST):  # noxfile.py's full sessions
            requirement = Requirement(f"torch=={os.environ[TORCH_UNDER_TEST]}")
        version = installed_version(requirement.name)
        assert version is not None and requirement.specifier.contains(version.split("+")[0]), (spec, version)
    return "installed"


def shortened_training(args: list[str]) -> list[str]:
    if "--help" in args:
        return args
    args = [re.sub(r"^--train_for_env_steps=(\d+)$", lambda m: f"--train_for_env_steps="
                   f"{max(int(m.group(1)) // SHORTEN, MIN_BUDGET)}", arg) for arg in args]
    if not any(arg.startswith("--train_for_env_steps=") for arg in args):
        args.append(f"--train_for_env_steps={SHORT_BUDGET}")
    if "--benchmark=True" in args:
        args += [f"--benchmark_env_steps={SHORT_BUDGET}", "--benchmark_raw_limit_s=1"]
    return args


def shortened_time_to_solve(args: list[str]) -> list[str]:
    return [re.sub(r"^\d+$", "1", arg) if previous == "--runs" else arg for previous, arg in zip([""] + args, args)]


# (how the command starts, how it is shortened, what its output must say); None: run as shown
RULES = [
    (["python", "-m", "appo.train", "--help"], None, "--train_for_env_steps"),
    (["python", "-m", "appo.train"], shortened_training, "Summary:"),
    (["python", "-m", "appo.enjoy"], None, "episodes: return"),
    (["python", "scripts/time_to_solve.py"], shortened_time_to_solve, "run 0:"),
]


def run_step(args: list[str], cwd: str) -> tuple[str, str]:
    """One command of a `&&` chain: (what ran, its output)."""
    if args[:2] == ["pip", "install"]:
        return shlex.join(args), check_pip_install(args)
    if args[:3] == ["python", "-m", "pytest"]:
        assert shlex.join(args) in (QUICK_CHECK, FULL_SUITE), f"`{shlex.join(args)}` is neither test command"
        return shlex.join(args), "a test command"
    for start, shorten, says in RULES:
        if args[:len(start)] == start:
            command = shlex.join(shorten(args) if shorten else args)
            output = run(["bash", "-c", localized(command)], cwd)
            assert says in output, f"{command} did not print {says!r}:\n{output[-3000:]}"
            return command, output
    pytest.fail(f"no rule to run `{shlex.join(args)}`: add one to tests/test_docs.py or show it in a ```text block")


def run_page(page: str, cwd: str) -> list[tuple[str, str]]:
    results = []
    for block in fenced(page, "bash"):
        for command in bash_commands(block):
            tokens = shlex.split(command, comments=True)
            while tokens:
                step = tokens[:tokens.index("&&")] if "&&" in tokens else tokens
                results.append(run_step(step, cwd))
                tokens = tokens[len(step) + 1:]
    return results


PAGES_WITH_COMMANDS = [page for page in PAGES if fenced(page, "bash")]


@pytest.mark.slow
def test_the_pages_show_commands_and_the_parsing_keeps_them_whole():
    assert {"README.md", "docs/training.md", "docs/envs.md", "docs/population.md"} <= set(PAGES_WITH_COMMANDS)
    assert shortened_training(["python", "-m", "appo.train", "--env=E", "--train_for_env_steps=1000000"])[-1] == \
        "--train_for_env_steps=10000"
    assert shortened_training(["python", "-m", "appo.train", "--benchmark=True"])[-3:] == \
        [f"--train_for_env_steps={SHORT_BUDGET}", f"--benchmark_env_steps={SHORT_BUDGET}", "--benchmark_raw_limit_s=1"]
    assert shortened_time_to_solve(["python", "s.py", "--runs", "3", "--", "--env=E"]) == \
        ["python", "s.py", "--runs", "1", "--", "--env=E"]
    assert fenced("README.md", "bash")[0].startswith("pip install torch==")


@pytest.mark.slow
@pytest.mark.timeout(420)
@pytest.mark.parametrize("page", PAGES_WITH_COMMANDS)
def test_page_commands_run(page, tmp_path):
    before = shm_entries()
    results = run_page(page, str(tmp_path))
    assert results, page
    assert leaked_segments(before) == set()


@pytest.mark.parametrize("page", [page for page in ALL_PAGES if fenced(page, "python")])
def test_python_fragments_compile(page):
    for number, block in enumerate(fenced(page, "python")):
        compile(block, f"{page} python block {number}", "exec")


# ---------------------------------------------------------------- links
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def prose(text: str) -> str:
    """The page without its fenced blocks and inline code, where brackets are code, not links."""
    return re.sub(r"`[^`\n]*`", "", FENCE.sub("", text))


def anchors(page: str) -> set[str]:
    """GitHub's ids for the page's headings: lower case, punctuation but - and _ dropped, spaces as -."""
    found, counts = set(), {}
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", FENCE.sub("", read(page)).replace("`", ""), re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        found.add(slug if slug not in counts else f"{slug}-{counts[slug]}")
        counts[slug] = counts.get(slug, 0) + 1
    return found


def test_every_relative_link_points_at_a_file_and_heading():
    broken = []
    for page in ALL_PAGES:
        for target in LINK.findall(prose(read(page))):
            if re.match(r"[a-z]+:", target):
                continue  # https:, mailto:
            path, _, anchor = target.partition("#")
            linked = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
            if not os.path.exists(os.path.join(REPO, linked)):
                broken.append(f"{page}: {target} (no {linked})")
            elif anchor and (not linked.endswith(".md") or anchor not in anchors(linked)):
                broken.append(f"{page}: {target} (no heading #{anchor} in {linked})")
    assert broken == []


def test_anchors_are_githubs():
    assert anchors("docs/PERFORMANCE.md") >= {"time-to-a-threshold", "doom-vizdoom", "the-cnn-on-a-cpu"}
    assert "2026-11-24-doom-vizdoom" in anchors("docs/performance_log.md")


def test_the_index_links_every_page_and_the_readme_is_short():
    index = set(LINK.findall(prose(read("docs/index.md"))))
    missing = [page for page in ALL_PAGES if page.startswith("docs/") and os.path.basename(page) not in index
               and page != "docs/index.md"]
    assert missing == []
    assert "docs/index.md" in LINK.findall(prose(read("README.md")))
    assert len(read("README.md").splitlines()) <= README_MAX_LINES


@pytest.mark.slow
def test_the_readme_keeps_the_two_set_up_commands():
    blocks = fenced("README.md", "bash")
    assert blocks[0].strip() == ("pip install torch==2.13.0 && pip install -e . && python -m appo.train "
                                 "--env=CartPole-v1 --experiment=cartpole --train_for_env_steps=1000000")
    install = 'pip install torch==2.13.0 && pip install -e ".[test]" && '
    assert [block.strip() for block in blocks[1:3]] == [install + QUICK_CHECK, install + FULL_SUITE]
    assert re.search(r"^" + re.escape(install + FULL_SUITE) + "$", read(".ci/run"), re.MULTILINE)
