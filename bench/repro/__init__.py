"""From a failing case to something a stranger can run: `repro` (a standalone reproduction of one case)."""
