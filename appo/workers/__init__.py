"""What a worker process is: `WorkerRole`, the interface of every role's class (roles.py; the table of roles, which
imports those classes, is appo/run/roles.py), and what each is handed at its start (context.py: `WorkerContext`,
`Queues`). Torch-free: the runner and the actors import it; a role's class is imported only by the process that
runs it."""
