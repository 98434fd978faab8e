"""What a worker process is: the table of every role, with the class that runs it and what its death leaves to
clean up (roles.py, where `WorkerRole`, the interface of those classes, is too), and what each is handed at its
start (context.py: `WorkerContext`, `Queues`). Torch-free: the runner and the actors import it; a role's class is
imported only by the process that runs it."""
