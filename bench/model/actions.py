"""Tools that take an action: one file tool (`action: "read" | "write" | ...`) plays several roles.

The policy finds a writer (`path` + `content`) and a reader (`path`) among the offered tools. A tool
with an enum parameter offering `write` or `read` (e.g. crewai-tools' file tool) is shown to the
policy as one tool per such action (`<name>#write` with the other parameters, `<name>#read` without
`content`), the calls made so far are shown the same way, and the policy's call of one of them is
made as the real tool's call with that action chosen.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from . import policy
from .policy import Call, Decision, Tool, ToolCall

ROLES = ("write", "read")


@dataclass(frozen=True)
class Role:
    """What a tool shown to the policy stands for: the real tool, its action parameter, the action."""

    tool: str
    param: str
    action: str

    @property
    def shown(self) -> str:
        return f"{self.tool}#{self.action}"


def _action_param(tool: Tool) -> tuple[str, list[str]] | None:
    for name, schema in (tool.parameters.get("properties") or {}).items():
        if isinstance(schema, Mapping) and (actions := [a for a in ROLES if a in (schema.get("enum") or ())]):
            return name, actions
    return None


def _shown(tool: Tool, param: str, action: str) -> Tool:
    dropped = {param} if action == "write" else {param, "content"}
    properties = {k: v for k, v in (tool.parameters.get("properties") or {}).items() if k not in dropped}
    required = [k for k in tool.parameters.get("required") or () if k not in dropped]
    return Tool(f"{tool.name}#{action}", {**tool.parameters, "properties": properties, "required": required})


def decide(tools: Sequence[Tool], calls: Sequence[Call]) -> Decision:
    """The policy's next step, with each action of an action-taking tool shown as a tool of its own."""
    shown: list[Tool] = []
    roles: dict[str, Role] = {}
    for tool in tools:
        found = _action_param(tool)
        if found is None:
            shown.append(tool)
            continue
        param, actions = found
        for action in actions:
            role = Role(tool.name, param, action)
            roles[role.shown] = role
            shown.append(_shown(tool, param, action))
    by_action = {(r.tool, r.action): r for r in roles.values()}
    params = {r.tool: r.param for r in roles.values()}

    def seen(call: Call) -> Call:
        role = by_action.get((call.name, str(call.arguments.get(params.get(call.name, "")))))
        if role is None:
            return call
        return Call(role.shown, {k: v for k, v in call.arguments.items() if k != role.param}, call.result)

    decision = policy.decide(shown, [seen(c) for c in calls])
    if isinstance(decision, ToolCall) and (chosen := roles.get(decision.name)) is not None:
        return ToolCall(chosen.tool, {chosen.param: chosen.action, **decision.arguments})
    return decision
