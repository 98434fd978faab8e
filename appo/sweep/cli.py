"""Hyper-parameter sweeps of the trainer with Optuna, offline: every trial is a normal `python -m appo.train` run.

    python -m appo.sweep examples/sweeps/acrobot.yaml --trials 20 --parallel 2
    python -m appo.sweep examples/sweeps/acrobot.yaml --report
    python -m appo.sweep SWEEP_FILE ... -- --device=cpu    (trainer flags for every trial after --)

The sweep file names the env, the trainer flags every trial shares and the search space (appo/sweep/space.py); the
study is stored in <train_dir>/<study>/study.db (or --storage, any Optuna RDB URL) and each trial runs in
<train_dir>/<study>/trial_<number>/. Running the same command again continues the study. The command-line options
win over the file's objective, sampler, pruner and trials. docs/guide_sweeps.md says it all.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time

from appo.config.cfg import NO_BUDGET, Config, ConfigError, OneLineParser, env_kwargs
from appo.envs import EnvError, env_info
from appo.sweep.objectives import OBJECTIVES, Objective
from appo.sweep.space import PRUNERS, SAMPLERS, Sweep, load_sweep, trainer_config
from appo.utils.logs import log, logger_restored, setup_logging
from appo.utils.process import EXIT_BAD_INPUT

DEFAULTS = {"objective": "final_reward", "sampler": "tpe", "pruner": "median", "trials": 20}
EXIT_CODES = {"finished": 0, "gave up": 1, "interrupted": 130}  # 130: as a shell reports a Ctrl-C


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="python -m appo.sweep", description=__doc__, allow_abbrev=False,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sweep_file", help="The sweep file (.yaml, .yml or .py).")
    parser.add_argument("--study", help="Study name, and folder under --train_dir (default: the file's study, else "
                                        "the file's name).")
    parser.add_argument("--trials", type=int, help="Finished trials (COMPLETE or PRUNED, earlier runs' included) to "
                                                   f"reach (default: the file's, else {DEFAULTS['trials']}).")
    parser.add_argument("--parallel", type=int, default=1, help="Trials run at once; they share this machine's cores.")
    parser.add_argument("--sampler", choices=SAMPLERS, help=f"Default: the file's, else {DEFAULTS['sampler']}.")
    parser.add_argument("--pruner", choices=PRUNERS, help=f"Default: the file's, else {DEFAULTS['pruner']}.")
    parser.add_argument("--objective", choices=tuple(OBJECTIVES),
                        help=f"Default: the file's, else {DEFAULTS['objective']}. " +
                             "; ".join(f"{o.name}: {o.help} ({o.direction}d)" for o in OBJECTIVES.values()))
    parser.add_argument("--storage", help="Optuna RDB URL (default: sqlite:///<train_dir>/<study>/study.db); "
                                          "postgresql://... or mysql://... for sweeps on many machines.")
    parser.add_argument("--train_dir", default="train_dir", help="Folder that holds the study's folder.")
    parser.add_argument("--seed", type=int, help="Seeds the sampler (the trainer's --seed goes in the file's flags).")
    parser.add_argument("--report", action="store_true", help="Only write the report of the study as it is.")
    return parser


def main(argv: list[str] | None = None) -> int:
    """`python -m appo.sweep`: the exit code (2: bad input, said in one line; 130: stopped by Ctrl-C)."""
    argv = sys.argv[1:] if argv is None else argv
    ours, extra = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    missing = [name for name in ("optuna", "yaml") if importlib.util.find_spec(name) is None]
    try:
        if missing:
            raise ConfigError(f"sweeps need {' and '.join(missing)}: pip install -e \".[sweep]\"")
        with logger_restored():  # a caller in-process (a notebook, the tests) keeps its logging
            return sweep(build_parser().parse_args(ours), extra)
    except (ConfigError, EnvError) as exc:
        print(f"appo.sweep: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT


def setting(args: argparse.Namespace, sweep_file: Sweep, key: str) -> str:
    return getattr(args, key) or sweep_file.settings.get(key) or DEFAULTS[key]


def checkpoints(cfg: Config, count: int) -> list[int]:
    """The env steps at which trials are reported to the pruner: every train_for_env_steps / count."""
    if cfg.train_for_env_steps >= NO_BUDGET:
        return []
    return sorted({cfg.train_for_env_steps * k // count for k in range(1, count + 1)} - {0})


def check_plan(args: argparse.Namespace, cfg: Config, objective: Objective, pruner: str, trials: int) -> None:
    """What the command line and the file must agree on, before anything is created."""
    if trials < 1 or args.parallel < 1:
        raise ConfigError(f"--trials={trials} and --parallel={args.parallel} must be 1 or more")
    if objective.needs_target and cfg.target_reward is None and cfg.target_objective is None:
        raise ConfigError(f"--objective={objective.name} needs a target: set target_reward (or target_objective) in "
                          "the file's flags")
    if pruner == "median" and cfg.train_for_env_steps >= NO_BUDGET:
        raise ConfigError("--pruner=median compares trials at fixed env steps: set train_for_env_steps in the file's "
                          "flags, or use --pruner none")


def sweep(args: argparse.Namespace, extra: list[str]) -> int:
    from appo.sweep import report, study
    from appo.sweep.scheduler import Scheduler

    sweep_file = load_sweep(args.sweep_file)
    objective = OBJECTIVES[setting(args, sweep_file, "objective")]
    sampler, pruner = setting(args, sweep_file, "sampler"), setting(args, sweep_file, "pruner")
    trials = args.trials if args.trials is not None else sweep_file.trials or DEFAULTS["trials"]
    name = args.study or sweep_file.study
    if os.sep in name or name in (".", ".."):
        raise ConfigError(f"--study={name!r}: must be a plain folder name")
    cfg = trainer_config(sweep_file, extra)
    check_plan(args, cfg, objective, pruner, trials)
    study.check_sampler(sampler)
    study_dir = os.path.join(args.train_dir, name)
    url = args.storage or study.default_storage(study_dir)
    if args.report and args.storage is None and not os.path.exists(os.path.join(study_dir, "study.db")):
        raise ConfigError(f"no study {name!r} in {study_dir}: run the sweep first")
    if not args.report:
        # The env can be made: else every trial would fail.
        env_info(cfg.env, env_kwargs(cfg), action_mask=cfg.action_mask)
    os.makedirs(study_dir, exist_ok=True)  # from here on, things are created
    setup_logging()
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = study.open_storage(url)
    points = checkpoints(cfg, sweep_file.pruning["checkpoints"])
    the_study, created = study.open_study(storage, name, sweep_file, extra, objective,
                                          lambda seen: study.make_sampler(sampler, args.seed, args.parallel, seen),
                                          study.make_pruner(pruner, sweep_file, points[0] if points else 1),
                                          create=not args.report)
    ended = "finished"
    if not args.report:
        finished = study.count(the_study, *study.FINISHED)
        log.info("%s study %s (%s, %s sampler, %s pruner) in %s: %d of %d trials finished",
                 "New" if created else "Continuing", name, objective.name, sampler, pruner, url, finished, trials)
        cores = len(os.sched_getaffinity(0))
        log.info("%d trial%s at once share this machine's %d cores: each trainer starts %d actor worker%s besides "
                 "its inference workers and learner", args.parallel, "s" if args.parallel > 1 else "", cores,
                 cfg.num_workers, "s" if cfg.num_workers > 1 else "")
        started = time.monotonic()
        ended = Scheduler(the_study, storage, sweep_file, extra, objective, study_dir, trials, args.parallel,
                          points).run()
        log.info("This run of the sweep: %s after %.0f s", ended, time.monotonic() - started)
        if ended == "interrupted":
            log.info("Run the same command again to continue the study")
    print(report.write_report(the_study, sweep_file, extra, objective, study_dir), flush=True)
    return EXIT_CODES[ended]
