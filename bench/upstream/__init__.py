"""E2B's own SDK tests as a suite (`upstream`): a source tree of E2B's SDK packages (a checkout of E2B's
repository, or the reference copy beside the project) whose test functions become the suite's cases.

In: the tree's path (`--upstream-source`, `E2B_BENCH_UPSTREAM_SOURCE`, or the default beside the checkout)
and the suite's manifest table (`needs`: the tests an endpoint may not be able to serve, and why).
Out: the steps of the suite (`source.py`, one per upstream test function, found without importing
anything) and what a runner's task says about them (`plan.py`: the source, the tests this endpoint
cannot serve). The runner itself (sandboxes/upstream/python/runner.py) runs the tests unmodified.
"""
