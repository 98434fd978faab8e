"""Hyper-parameter sweeps with Optuna (`python -m appo.sweep`, appo/sweep/cli.py): the sweep file and its search
space (space.py), what is optimised (objectives.py), the study and its storage (study.py), one trial's trainer
process (trial.py), running trials side by side (scheduler.py), and the report (report.py). Torch-free: trials are
trainer processes of their own."""
