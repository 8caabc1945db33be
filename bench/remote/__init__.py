"""Running against a remote endpoint: deadlines, restarts, budgets and what a run's sandboxes cost."""
