"""What the runner kits saw between steps, said on the terminal as it happens.

The kits (sandboxes/e2b/python/hygiene.py, sandboxes/e2b/ts/hygiene.mjs) put it in a step's `details.hygiene`:
`left_behind` (commands the step left running on a shared sandbox, which the kit then ended), `replaced` (a shared
sandbox found holding leftovers or not answering before the step, replaced by a fresh one; `left_by` names the
step that ran on it last), `kept` (the same for a sandbox later steps need: its leftovers ended instead),
`crawl` (steps in a row that kept timing out on one sandbox, and whether it was replaced), `sandboxes_ended`
(sandboxes the step made for itself, killed when it ended), `unlisted` (a shared sandbox whose envd answers
the process list with an error: its processes go unchecked) and `census` (processes listed after the step).
"""

from __future__ import annotations

from typing import Any

from bench.results import case_id


def _items(report: dict[str, Any], key: str) -> list[dict[str, Any]]:
    value = report.get(key)
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def _case(suite: str, runner: str, step: object) -> str:
    return case_id(suite, runner, str(step)) if step else "(none yet)"


def hygiene_lines(suite: str, runner: str, event: dict[str, Any]) -> list[str]:
    """One line per event the kit reported in this step event's details (none for a clean step)."""
    details = event.get("details")
    report = details.get("hygiene") if isinstance(details, dict) else None
    if not isinstance(report, dict):
        return []
    step = case_id(suite, runner, str(event.get("id")))
    lines = []
    left: dict[str, list[dict[str, Any]]] = {}
    for item in _items(report, "left_behind"):
        left.setdefault(str(item.get("sandbox")), []).append(item)
    for sandbox, items in left.items():
        commands = "; ".join(f"{item.get('command')} (pid {item.get('pid')})" for item in items)
        ended = "ended them" if all(item.get("ended") for item in items) else "could not end them all"
        lines.append(f"case {step} left {len(items)} command(s) running on sandbox {sandbox}: {commands}; {ended}")
    for key in ("replaced", "kept"):
        for item in _items(report, key):
            reason, culprit = str(item.get("reason")), _case(suite, runner, item.get("left_by"))
            what = (
                f"sandbox {item.get('sandbox')} held what case {culprit} left ({reason.removeprefix('left running: ')})"
                if reason.startswith("left running")
                else f"sandbox {item.get('sandbox')} stopped answering after case {culprit} ({reason})"
            )
            done = (
                f"replaced it before case {step}"
                if key == "replaced"
                else ("ended them (later cases need it)" if item.get("ended") else "kept it: later cases need it")
            )
            lines.append(f"{what}: {done}")
    for item in _items(report, "crawl"):
        since = _case(suite, runner, item.get("since"))
        done = "replacing it" if item.get("replaced") else "it cannot be replaced (later cases need it)"
        lines.append(
            f"cases on sandbox {item.get('sandbox')} keep timing out since case {since} "
            f"({item.get('in_a_row')} in a row): {done}"
        )
    for item in _items(report, "unlisted"):
        lines.append(
            f"sandbox {item.get('sandbox')} gives no list of its processes ({item.get('reason')}): "
            "what cases leave on it goes unchecked"
        )
    if report.get("fault"):
        lines.append(f"the runner's check between cases failed in case {step}: {report['fault']}")
    return lines
