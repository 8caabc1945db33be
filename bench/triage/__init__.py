"""Judging and explaining a run: what failed, why, and how to run it again."""
