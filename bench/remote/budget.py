"""What a run may spend and what it did spend: the sandbox quota, the time budget and the cost figure.

Limits and prices come from the endpoint's table in endpoints.toml (`max_sandboxes`,
`price_per_vcpu_second`, `price_per_gib_second`, `currency`, `sandbox_vcpus`, `sandbox_memory_gib`);
E2B's own cloud gets its free tier's concurrency quota when no table says otherwise; the embedded
endpoint is unlimited unless `--max-sandboxes` says so.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

E2B_CLOUD_DOMAIN = "e2b.app"
E2B_FREE_TIER_SANDBOXES = 20  # concurrently running sandboxes of E2B's free (Hobby) tier
DEFAULT_VCPUS = 2  # E2B's default sandbox size, when the endpoint's table does not say
DEFAULT_MEMORY_GIB = 0.5
MAX_SANDBOXES_HELP = (
    "concurrent sandboxes across all runners; creates beyond it wait (default: the endpoint's max_sandboxes, E2B's "
    "free-tier quota for E2B's cloud, unlimited for the embedded endpoint)"
)
MAX_MINUTES_HELP = "end the run after this many minutes, keeping every finished case (the rest: not run)"
NUMBER_KEYS = ("price_per_vcpu_second", "price_per_gib_second", "sandbox_vcpus", "sandbox_memory_gib")


class BudgetError(ValueError):
    """A budget key of an endpoint's table has a value of the wrong kind."""


@dataclass(frozen=True)
class Budget:
    """The endpoint's limits and prices (None: unlimited, or no price known)."""

    max_sandboxes: int | None = None
    price_per_vcpu_second: float | None = None
    price_per_gib_second: float | None = None
    currency: str = "USD"
    sandbox_vcpus: float = DEFAULT_VCPUS
    sandbox_memory_gib: float = DEFAULT_MEMORY_GIB

    @classmethod
    def from_table(cls, table: Mapping[str, Any], where: str, default_max: int | None = None) -> Budget:
        """The budget keys of an endpoint's table; a wrong value raises BudgetError naming the key."""
        found: dict[str, Any] = {}
        quota = table.get("max_sandboxes", default_max)
        if quota is not None and (isinstance(quota, bool) or not isinstance(quota, int) or quota < 1):
            raise BudgetError(f"{where}: max_sandboxes must be a whole number of at least 1, not {quota!r}")
        found["max_sandboxes"] = quota
        for key in NUMBER_KEYS:
            value = table.get(key)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise BudgetError(f"{where}: {key} must be a number of at least 0, not {value!r}")
            found[key] = float(value)
        if "currency" in table:
            found["currency"] = str(table["currency"])
        return cls(**found)

    def with_max(self, max_sandboxes: int | None) -> Budget:
        """`--max-sandboxes N` overrides the endpoint's quota."""
        if max_sandboxes is None:
            return self
        return Budget(**{**self.__dict__, "max_sandboxes": max_sandboxes})

    def cost(self, sandbox_seconds: Mapping[str, float]) -> dict[str, Any]:
        """The cost figure of a run: sandbox-seconds by suite, their total and, with prices, money."""
        total = sum(sandbox_seconds.values())
        figure: dict[str, Any] = {
            "sandbox_seconds": {suite: round(seconds, 1) for suite, seconds in sorted(sandbox_seconds.items())},
            "total_sandbox_seconds": round(total, 1),
            "estimate": None,
        }
        if self.price_per_vcpu_second is not None or self.price_per_gib_second is not None:
            per_second = (self.price_per_vcpu_second or 0.0) * self.sandbox_vcpus + (
                self.price_per_gib_second or 0.0
            ) * self.sandbox_memory_gib
            figure["estimate"] = {
                "amount": round(total * per_second, 6),
                "currency": self.currency,
                "vcpus": self.sandbox_vcpus,
                "memory_gib": self.sandbox_memory_gib,
            }
        return figure


def cost_line(cost: Mapping[str, Any]) -> str:
    """One line for the terminal and the report: `412.3 sandbox-s (quickstart 120.1, ...) ≈ 0.0123 USD`."""
    by_suite = ", ".join(f"{suite} {seconds:g}" for suite, seconds in cost["sandbox_seconds"].items())
    line = f"{cost['total_sandbox_seconds']:g} sandbox-seconds" + (f" ({by_suite})" if by_suite else "")
    estimate = cost.get("estimate")
    if estimate:
        line += (
            f", about {estimate['amount']:.4f} {estimate['currency']} "
            f"at {estimate['vcpus']:g} vCPU and {estimate['memory_gib']:g} GiB a sandbox"
        )
    else:
        line += " (no price per vCPU-second or GiB-second in the endpoint's table)"
    return line


def merged_cost(costs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The cost figure of runs taken together (the shards of one run): sandbox-seconds summed by suite, and
    money summed when every run has an estimate at the same prices' terms, else none."""
    by_suite: Counter[str] = Counter()
    for cost in costs:
        by_suite.update(cost["sandbox_seconds"])
    figure: dict[str, Any] = {
        "sandbox_seconds": {suite: round(seconds, 1) for suite, seconds in sorted(by_suite.items())},
        "total_sandbox_seconds": round(sum(cost["total_sandbox_seconds"] for cost in costs), 1),
        "estimate": None,
    }
    estimates = [cost.get("estimate") for cost in costs]
    terms = {(e["currency"], e["vcpus"], e["memory_gib"]) for e in estimates if e}
    if costs and all(estimates) and len(terms) == 1:
        currency, vcpus, memory_gib = terms.pop()
        amount = round(sum(e["amount"] for e in estimates if e), 6)
        figure["estimate"] = {"amount": amount, "currency": currency, "vcpus": vcpus, "memory_gib": memory_gib}
    return figure


def retries_figure(by_status: Mapping[Any, int]) -> dict[str, Any]:
    """The footer's retries: how many answers the wire proxies retried, in all and by status."""
    counts = {str(status): count for status, count in sorted(by_status.items(), key=lambda kv: str(kv[0])) if count}
    return {"total": sum(counts.values()), "by_status": counts}
