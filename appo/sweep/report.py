"""What a sweep leaves in <train_dir>/<study>/ at its end (or with `--report` alone): results.md (every trial: number,
state, params, value, env steps, wall time, reason), history.png and importance.png (Optuna's matplotlib plots;
importances need 2 complete trials), and the best trial as a ready command in best_command.txt.
"""

from __future__ import annotations

import datetime
import os
import shlex
import warnings

import optuna
from optuna.trial import FrozenTrial, TrialState

from appo.sweep.objectives import Objective
from appo.sweep.space import Sweep
from appo.utils.files import atomic_write_text


def best_command(sweep: Sweep, extra: list[str], trial: FrozenTrial, study_name: str) -> str:
    """The best trial's training as one `python -m appo.train` command (in an experiment of its own)."""
    args = sweep.trainer_args(trial.params, extra)
    return shlex.join(["python", "-m", "appo.train", args[0], f"--experiment={study_name}_best", *args[1:]])


def wall_time(trials: list[FrozenTrial]) -> datetime.timedelta:
    """From the first trial's start to the last one's end, over every run of the sweep command."""
    starts = [t.datetime_start for t in trials if t.datetime_start]
    ends = [t.datetime_complete for t in trials if t.datetime_complete]
    if not starts or not ends:
        return datetime.timedelta(0)
    return datetime.timedelta(seconds=round((max(ends) - min(starts)).total_seconds()))


def cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def table(study: optuna.Study, sweep: Sweep) -> list[str]:
    names = [param.flag for param in sweep.space]
    lines = [f"| trial | state | {' | '.join(names)} | value | env steps | wall time (s) | reason |",
             f"| ---: | --- | {' | '.join('---:' for _ in names)} | ---: | ---: | ---: | --- |"]
    for trial in study.get_trials(deepcopy=False):
        attrs = trial.user_attrs
        params = [cell(trial.params.get(name)) for name in names]
        value = cell(trial.value) if trial.state is TrialState.COMPLETE else ""
        if attrs.get("reached") is False:
            value += " (target not reached)"
        lines.append(f"| {trial.number} | {trial.state.name} | {' | '.join(params)} | {value} | "
                     f"{cell(attrs.get('env_steps'))} | {cell(attrs.get('seconds'))} | {cell(attrs.get('reason'))} |")
    return lines


def draw(study: optuna.Study, study_dir: str, objective: Objective) -> list[str]:
    """history.png and importance.png; returns a line for each plot not drawn, saying why."""
    complete = len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))
    if complete == 0:
        return ["No plots: no trial has completed."]
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from optuna.visualization import matplotlib as plots
    except ImportError:
        return ['No plots: they need matplotlib (pip install -e ".[plot]").']
    notes = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        figures = [("history.png", plots.plot_optimization_history)]
        if complete < 2:
            notes.append("No importance.png: parameter importances need at least 2 complete trials.")
        else:
            figures.append(("importance.png", plots.plot_param_importances))
        for name, plot in figures:
            try:
                ax = plot(study, target_name=objective.name)
            except (ImportError, RuntimeError, ValueError) as exc:  # e.g. no variance to attribute
                notes.append(f"No {name}: {' '.join(str(exc).split())}")
                continue
            ax.figure.savefig(os.path.join(study_dir, name), dpi=100, bbox_inches="tight")
            plt.close(ax.figure)
    return notes


def write_report(study: optuna.Study, sweep: Sweep, extra: list[str], objective: Objective, study_dir: str) -> str:
    """Writes the outputs; returns what to print: the best trial, its command, the counts and the wall time."""
    trials = study.get_trials(deepcopy=False)
    counts = {state: sum(t.state is state for t in trials) for state in TrialState}
    summary = (f"{counts[TrialState.COMPLETE]} complete, {counts[TrialState.PRUNED]} pruned, "
               f"{counts[TrialState.FAIL]} failed, {counts[TrialState.RUNNING]} running; wall time "
               f"{wall_time(trials)}")
    notes = draw(study, study_dir, objective)
    lines = [f"# Sweep {study.study_name}", "",
             f"Env `{sweep.env}`, sweep file `{sweep.path}`; objective `{objective.name}` ({objective.direction}): "
             f"{objective.help}.", "", f"Trials: {summary}.", "", *table(study, sweep), ""]
    printed = [f"Study {study.study_name}: {summary}"]
    if counts[TrialState.COMPLETE]:
        best = study.best_trial
        command = best_command(sweep, extra, best, study.study_name)
        atomic_write_text(os.path.join(study_dir, "best_command.txt"), command + "\n")
        said = f"Best: trial {best.number}, {objective.name} {best.value:.6g}"
        lines += [said + ":", "", "```bash", command, "```", ""]
        printed += [said + "; to train it:", command]
    lines += [f"![{name}]({name}.png)" for name in ("history", "importance")
              if os.path.exists(os.path.join(study_dir, f"{name}.png"))]
    lines += ["", *notes] if notes else []
    atomic_write_text(os.path.join(study_dir, "results.md"), "\n".join(lines).rstrip() + "\n")
    printed += notes + [f"Results: {os.path.join(study_dir, 'results.md')}"]
    return "\n".join(printed)
