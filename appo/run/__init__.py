"""The main process: the runner, the table of worker roles (roles.py), the supervisor that replaces dead workers,
the reports it aggregates and the Ray backend. Torch-free: workers are forked from it."""
