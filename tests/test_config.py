"""The configuration: one table entry per flag, a frozen typed `Config`, per-role views that cannot drift from what
each role's modules read, range errors made from the table, and cfg.json kept as before."""

from __future__ import annotations

import ast
import dataclasses
import glob
import json
import os
import typing
from functools import cache

import pytest

from appo.config import Config, ConfigError
from appo.config.cfg import (
    build_parser,
    flag_values,
    load_saved_cfg,
    make_config,
    merge_resumed,
    parse_args,
    save_cfg,
    saved_config,
)
from appo.config.checks import FLAG_CHECKS, TRACKERS, validate
from appo.config.flags import COMMAND_LINE_ONLY, FLAG_NAMES, spec, value_type
from appo.config.hyperparams import MUTABLE, Hyperparams
from appo.config.views import ROLE_VIEWS, ActorConfig, EvaluatorConfig, InferenceConfig, LearnerConfig, RunnerConfig
from tests.conftest import REPO, source_file

# ---------------------------------------------------------------- which flags a module reads (ast)
FOLLOWED_PACKAGES = ("appo",)
COMPUTED = "getattr(cfg, <computed name>)"
# Helpers of the config package that read flags by computed names from a table of its own, and the flags they read.
TABLE_READS = {(os.path.join(REPO, "appo", "config", "checks.py"), "trackers_on"): {t.flag for t in TRACKERS}}


def is_cfg(node: ast.AST) -> bool:
    return (isinstance(node, ast.Name) and node.id == "cfg") or (isinstance(node, ast.Attribute) and node.attr == "cfg")


def direct_reads(node: ast.AST, path: str) -> set[str]:
    """`cfg.<name>`, `<x>.cfg.<name>` and `getattr(cfg, "<name>")` in `node`. A computed getattr cannot be checked;
    only the config package (which builds views and `Hyperparams` from a whole `Config`) may use one."""
    names = set()
    for child in ast.walk(node):
        if isinstance(child, ast.Attribute) and is_cfg(child.value):
            names.add(child.attr)
        elif (isinstance(child, ast.Call) and isinstance(child.func, ast.Name) and child.func.id == "getattr"
              and len(child.args) >= 2 and is_cfg(child.args[0])):
            name = child.args[1]
            if isinstance(name, ast.Constant):
                names.add(name.value)
            elif not path.startswith(os.path.join(REPO, "appo", "config")):
                names.add(COMPUTED)
    return names


def module_path(module: str) -> str | None:
    """The file of a module of this repository; None for others (the standard library, torch, ...)."""
    if module.split(".")[0] not in FOLLOWED_PACKAGES:
        return None
    return source_file(module)


@cache
def parsed(path: str) -> tuple[ast.Module, dict[str, ast.AST], dict[str, tuple[str, str | None]]]:
    """A module's tree, its top-level definitions, and its imports from this repository: name -> (file, name in
    it), with name None for an imported module."""
    with open(path) as f:
        tree = ast.parse(f.read())
    definitions = {node.name: node for node in tree.body
                   if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    imports: dict[str, tuple[str, str | None]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                submodule, module = module_path(f"{node.module}.{alias.name}"), module_path(node.module)
                if submodule or module:
                    imports[alias.asname or alias.name] = (submodule, None) if submodule else (module, alias.name)
    return tree, definitions, imports


def dotted(func: ast.AST) -> list[str]:
    """`a.b.c(...)` -> ["a", "b", "c"]; [] for a call of anything else (a subscript, a call's result)."""
    parts = []
    while isinstance(func, ast.Attribute):
        parts.insert(0, func.attr)
        func = func.value
    return [func.id, *parts] if isinstance(func, ast.Name) else []


def target(path: str, parts: list[str]) -> tuple[str, str, str | None] | None:
    """The definition a call `parts` reaches from module `path`: (file, top-level name, method or None)."""
    for _ in range(5):  # through imports and re-exports
        _, definitions, imports = parsed(path)
        if parts and parts[0] in definitions:
            return path, parts[0], parts[1] if len(parts) > 1 else None
        if not parts or parts[0] not in imports:
            return None
        source, name = imports[parts[0]]
        path, parts = source, [name, *parts[1:]] if name else parts[1:]
    return None


def definition_reads(path: str, name: str, method: str | None, seen: set) -> set[str]:
    """The flags a definition (a function, a class's method, or all of a class) reads, with the helpers it calls."""
    if (path, name, method) in seen:
        return set()
    seen.add((path, name, method))
    if (path, name) in TABLE_READS:
        return TABLE_READS[path, name]
    node = parsed(path)[1][name]
    if method is not None:
        if not isinstance(node, ast.ClassDef):
            return set()  # an attribute of a function: not followed
        node = next((n for n in node.body if getattr(n, "name", None) == method), None)
        if node is None:
            return set()
    return direct_reads(node, path) | called_reads(path, node, seen)


def called_reads(path: str, node: ast.AST, seen: set) -> set[str]:
    reads: set[str] = set()
    for child in ast.walk(node):
        found = target(path, dotted(child.func)) if isinstance(child, ast.Call) else None
        if found is not None:
            reads |= definition_reads(*found, seen)
    return reads


def module_reads(path: str) -> set[str]:
    """Every flag a module reads, itself or through the helpers of this repository it calls."""
    tree = parsed(path)[0]
    return direct_reads(tree, path) | called_reads(path, tree, set())


def files(*patterns: str, leave_out: tuple[str, ...] = ()) -> list[str]:
    found = [path for pattern in patterns for path in sorted(glob.glob(os.path.join(REPO, pattern), recursive=True))]
    return [path for path in found if os.path.basename(path) not in ("__init__.py", *leave_out)]


# Each role's own modules; the helpers they call are followed.
ROLE_MODULES = {
    ActorConfig: lambda: files("appo/sampling/*.py", leave_out=("inference_worker.py", "sampler_group.py")),
    InferenceConfig: lambda: files("appo/sampling/inference_worker.py", "appo/learning/model.py"),
    LearnerConfig: lambda: files("appo/learning/*.py", leave_out=("evaluator.py", "trained_policy.py")),
    EvaluatorConfig: lambda: files("appo/learning/evaluator.py", "appo/learning/model.py"),
    RunnerConfig: lambda: files("appo/run/**/*.py", "appo/sampling/sampler_group.py"),
}


# ---------------------------------------------------------------- the table
def test_every_flag_is_in_the_table_once():
    parser = build_parser()
    options = [option[2:] for action in parser._actions if action.dest != "help" for option in action.option_strings]
    table = [option for name in (*FLAG_NAMES, *COMMAND_LINE_ONLY) for option in (name, *spec(name).aliases)]
    assert sorted(options) == sorted(table) and len(table) == len(set(table))
    assert [f.name for f in dataclasses.fields(Config)] == list(FLAG_NAMES)


@pytest.mark.parametrize("name", [name for name in FLAG_NAMES if spec(name).valid is not None])
def test_a_value_out_of_its_range_is_one_line_naming_the_flag(name):
    valid, (kind, _) = spec(name).valid, value_type(name)
    outside = valid.low - 1 if valid.low > -float("inf") else valid.high + 1
    cfg = dataclasses.replace(Config(env="CartPole-v1"), **{name: kind(outside)})
    with pytest.raises(ConfigError) as error:
        validate(cfg)
    message = str(error.value)
    assert message.startswith(f"--{name}={kind(outside)}: must be") and "\n" not in message


def test_an_open_bound_is_outside_its_range():
    """torch's Adam refuses a beta of 1 in the learner process, after the experiment dir exists: the flags refuse it."""
    with pytest.raises(ConfigError, match=r"--adam_beta1=1.0: must be within \[0, 1\)"):
        validate(dataclasses.replace(Config(env="CartPole-v1"), adam_beta1=1.0))
    with pytest.raises(ConfigError, match=r"--value_loss_coeff=0.0: must be positive"):
        validate(dataclasses.replace(Config(env="CartPole-v1"), value_loss_coeff=0.0))


def test_a_value_of_the_wrong_type_or_choice_is_refused():
    for name, value, expected in [("num_workers", "2", "--num_workers='2': must be an integer"),
                                  ("use_rnn", 1, "--use_rnn=1: must be True or False"),
                                  ("rnn_type", "rnn", "--rnn_type=rnn: must be one of gru, lstm")]:
        with pytest.raises(ConfigError, match=expected):
            validate(dataclasses.replace(Config(env="CartPole-v1"), **{name: value}))
    validate(Config(env="CartPole-v1", learning_rate=1, seed=None))  # an int is a number; None where allowed


# ---------------------------------------------------------------- the frozen Config
def test_the_config_is_frozen_and_typed():
    cfg, _ = parse_args(["--env=CartPole-v1", "--num_workers=3", "--rnn_size=32"])
    assert isinstance(cfg, Config) and (cfg.num_workers, cfg.hidden_size) == (3, 32)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.num_workers = 4
    assert dataclasses.replace(cfg, num_workers=4).num_workers == 4 and cfg.num_workers == 3


def test_make_config_resolves_what_depends_on_the_env():
    cfg = make_config(env="CartPole-v1", use_rnn=True)
    assert (cfg.recurrence, cfg.agent_policy_mapping) == (cfg.rollout, "split")
    assert make_config(num_agents=2, env="coop_multi_agent", num_policies=2).agent_policy_mapping == "episode"
    with pytest.raises(ConfigError, match="--batch_size=100 must be a multiple of --rollout=32"):
        make_config(env="CartPole-v1", batch_size=100)
    with pytest.raises(ConfigError, match="--lr_schedule=linear decays to 0 at --train_for_env_steps: give that"):
        make_config(env="CartPole-v1", lr_schedule="linear")
    assert make_config(env="CartPole-v1", lr_schedule="linear", train_for_env_steps=10**6).lr_schedule == "linear"
    assert make_config(env="CartPole-v1", lr_schedule="kl_adaptive").lr_schedule == "kl_adaptive"  # no budget needed
    with pytest.raises(ConfigError, match="--proximal_policy=iteration weights GAE's advantages"):
        make_config(env="CartPole-v1", proximal_policy="iteration", with_vtrace=True)
    with pytest.raises(ConfigError, match="--recompute_advantages=True computes GAE again every pass"):
        make_config(env="CartPole-v1", recompute_advantages=True, with_vtrace=True)
    for flag in ("use_rnn", "with_vtrace"):
        with pytest.raises(ConfigError, match=f"--minibatch_unit=step draws minibatches of single steps; --{flag}="):
            make_config(env="CartPole-v1", minibatch_unit="step", **{flag: True})


def test_minibatch_unit_auto_is_steps_where_a_model_and_loss_allow_them():
    """auto: single steps for a feed-forward model with GAE; whole trajectories for a recurrent model or V-trace,
    which need a step's neighbours in its minibatch. A given unit is kept."""
    assert make_config(env="CartPole-v1", minibatch_unit="auto").minibatch_unit == "step"
    for flag in ("use_rnn", "with_vtrace"):
        assert make_config(env="CartPole-v1", minibatch_unit="auto", **{flag: True}).minibatch_unit == "trajectory"
    assert make_config(env="CartPole-v1", minibatch_unit="trajectory").minibatch_unit == "trajectory"


def test_cfg_json_saved_before_minibatch_unit_resumes_on_the_minibatches_it_trained_on(tmp_path):
    """A cfg.json written before --minibatch_unit existed trained on whole trajectories, or on single steps where it
    had --shuffle_steps=True: resumed, it keeps them, whatever today's default."""
    cfg, _ = parse_args(["--env=CartPole-v1", "--restart=True"])
    for shuffled, unit in ((False, "trajectory"), (True, "step")):
        saved = {name: value for name, value in flag_values(cfg).items() if name != "minibatch_unit"}
        path = tmp_path / f"cfg_{shuffled}.json"
        path.write_text(json.dumps(saved | {"shuffle_steps": shuffled}))
        assert load_saved_cfg(str(path))["minibatch_unit"] == unit
        assert merge_resumed(cfg, set(), load_saved_cfg(str(path)))[0].minibatch_unit == unit


def test_a_resumed_runs_flags_are_checked_together_with_its_saved_ones(tmp_path):
    """The command line of a resumed run is checked across flags once its saved ones are merged in: --recurrence=4
    alone on a recurrent run resumes (it was refused for want of --use_rnn=True, which cfg.json holds), where the
    same flag on a new feed-forward run is refused and writes nothing."""
    from appo.launch import prepare  # the launch's imports (envs, spaces) are not this module's

    def args(experiment: str, *flags: str) -> list[str]:
        return [f"--train_dir={tmp_path}", f"--experiment={experiment}", "--env=CartPole-v1", *flags]

    prepare(*parse_args(args("rnn", "--use_rnn=True", "--rollout=16"), FLAG_CHECKS))
    cfg, _, notes, _ = prepare(*parse_args(args("rnn", "--recurrence=4"), FLAG_CHECKS))
    assert (cfg.use_rnn, cfg.rollout, cfg.recurrence) == (True, 16, 4)
    assert notes == ["--recurrence: 16 (saved) -> 4 (command line)"]
    with pytest.raises(ConfigError, match=r"^--recurrence=4 needs --use_rnn=True"):
        prepare(*parse_args(args("feed_forward", "--recurrence=4"), FLAG_CHECKS))
    assert not (tmp_path / "feed_forward").exists()


def test_evaluating_a_game_played_on_every_seat_warns_that_zero_sum_scores_are_0(tmp_path, caplog):
    """The evaluation plays a policy on both seats of a two-player game: its mean over seats is 0 in a zero-sum game,
    and best.pth kept the first evaluation of a self-play run."""
    from appo.launch import prepare

    prepare(*parse_args([f"--train_dir={tmp_path}", "--experiment=ttt", "--env=pettingzoo.classic.tictactoe_v3:env",
                         "--eval_every_env_steps=1000"], FLAG_CHECKS))
    assert "which a zero-sum game makes 0 whatever the policy" in caplog.text
    caplog.clear()
    prepare(*parse_args([f"--train_dir={tmp_path}", "--experiment=cp", "--env=CartPole-v1",
                         "--eval_every_env_steps=1000"], FLAG_CHECKS))
    assert "zero-sum" not in caplog.text


def test_cfg_json_keeps_its_format_and_resumes(tmp_path):
    cfg, _ = parse_args(["--env=CartPole-v1", "--num_workers=3", "--restart=True"])
    path = str(tmp_path / "cfg.json")
    save_cfg(cfg, path)
    with open(path) as f:
        text = f.read()
    assert text == json.dumps({name: getattr(cfg, name) for name in FLAG_NAMES}, indent=2, sort_keys=True)
    assert saved_config(path) == cfg
    old = load_saved_cfg(path)
    del old["eval_episodes"]  # a flag added after the experiment was saved takes its default
    old["no_longer_a_flag"] = 1
    given_cfg, given = parse_args(["--env=CartPole-v1", "--learning_rate=0.01"])
    merged, notes = merge_resumed(given_cfg, given, old)
    assert (merged.num_workers, merged.learning_rate, merged.eval_episodes) == (3, 0.01, 10)
    assert merged.restart is False  # the saved --restart=True was for the run that saved it
    assert notes == ["--learning_rate: 0.001 (saved) -> 0.01 (command line)",
                     "no_longer_a_flag=1 (saved) is no flag of this version: ignored"]


# ---------------------------------------------------------------- views per role
def test_views_are_typed_as_the_config():
    config_types = typing.get_type_hints(Config)
    for view in ROLE_VIEWS:
        for name, kind in typing.get_type_hints(view).items():
            assert name in config_types and kind == config_types[name], f"{view.__name__}.{name}"


def test_a_view_is_built_from_the_config_and_holds_only_its_flags():
    cfg = make_config(env="CartPole-v1", num_workers=3)
    actor = ActorConfig.of(cfg)
    assert actor.num_workers == 3 and not hasattr(actor, "learning_rate")
    with pytest.raises(dataclasses.FrozenInstanceError):
        actor.num_workers = 1


def test_the_learner_view_leaves_the_pbt_hyperparameters_to_hyperparams():
    hyperparams = {f.name for f in dataclasses.fields(Hyperparams)}
    assert hyperparams == set(MUTABLE)
    for view in (ActorConfig, InferenceConfig, LearnerConfig, EvaluatorConfig):
        assert not hyperparams & {f.name for f in dataclasses.fields(view)}, view


@pytest.mark.parametrize("view", ROLE_VIEWS, ids=lambda view: view.__name__)
def test_each_role_reads_only_the_flags_of_its_view(view):
    """Parses the role's modules (and the helpers they call): every flag read must be a field of the view, and
    every field must be read, so the views cannot drift from the code."""
    reads = {os.path.relpath(module, REPO): module_reads(module) for module in ROLE_MODULES[view]()}
    assert reads
    fields = {f.name for f in dataclasses.fields(view)}
    derived = {name for name, member in vars(view).items() if isinstance(member, property)}  # made of its fields
    undeclared = {name: [m for m, names in reads.items() if name in names] for names in reads.values()
                  for name in names - fields - derived}
    assert not undeclared, f"read by the role but not fields of {view.__name__}: {undeclared}"
    unread = fields - set().union(*reads.values())
    assert not unread, f"{view.__name__} holds flags its role no longer reads: {sorted(unread)}"
