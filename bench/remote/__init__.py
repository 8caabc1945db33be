"""Running against a remote endpoint: what its conditions (rate limits, transient errors) mean for a run."""
