"""Running against a remote endpoint: deadlines, restarts, budgets, what a run's sandboxes cost, and what its
conditions (rate limits, transient errors) mean for a run."""
