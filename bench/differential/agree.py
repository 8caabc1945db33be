"""An answer against its own second path, in the same run: what the endpoint says of a file against what `stat` in
the sandbox says of it right after, and of a sandbox's resources against what the sandbox itself says
(bench/differential/probe.py), whatever the reference holds.

A metrics sample's (the last one of the answer) CPU count must be the sandbox's (a limited cgroup's quota); its memory
total, disk size and disk use of the order of the sandbox's (the cgroup's memory limit; `df /`), within a factor
MAGNITUDE: a figure in other units (MiB for bytes) is far off, a moment's use is not. Without a cgroup limit in sight
the memory total is held against MemTotal within a factor UNITS (a sandbox may see its host's memory: only a figure
in other units is that far off). A disk use under a mebibyte on either side is not judged.

An entry an answer gives (Filesystem Stat, MakeDir, Move: `entry.*`) names the file the probe stats (the path the
call asked about, its destination): its size, permission bits, owner, group and modification time must be the
file's. The time is compared at the entry's own precision (a coarser one is the reference comparison's to judge);
a symbolic link's entry describes its target in places, and is left out.
"""

from __future__ import annotations

from typing import Any

from .policy import MAGNITUDE, parse_time

STAT_SAYS = "`stat` in the sandbox says otherwise"
SANDBOX_SAYS = "the sandbox itself says otherwise (cgroup, nproc, df)"
MIB = 1 << 20
UNITS = 512.0  # a memory total against a host's MemTotal (no cgroup limit in sight): only other units are this far


def _fraction(text: str) -> str:
    """The fractional digits of a time as written (`...:53.12Z` -> `12`)."""
    _, dot, rest = text.partition(".")
    digits = ""
    for char in rest if dot else "":
        if not char.isdigit():
            break
        digits += char
    return digits


def _same_moment(entry: str, stat: str) -> bool:
    """Whether two times are one moment to the precision `entry` is written in."""
    mine, theirs = parse_time(entry), parse_time(stat)
    if mine is None or theirs is None:
        return True  # not a time: the reference comparison judges its form
    digits = min(len(_fraction(entry)), 9)
    cut = [int(_fraction(text).ljust(9, "0")[:digits] or "0") for text in (entry, stat)]
    return int(mine.timestamp()) == int(theirs.timestamp()) and cut[0] == cut[1]


def entry_against_stat(answer: dict[str, Any], probe: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """(field path, what `stat` says, what the answer says) for each entry field the file contradicts."""
    if not probe.get("stat.exists") or "entry.name" not in answer:
        return []
    if answer.get("entry.symlinkTarget") or answer.get("entry.type") == "FILE_TYPE_SYMLINK":
        return []
    found: list[tuple[str, Any, Any]] = []
    size = answer.get("entry.size")
    if size is not None and str(size) != str(probe.get("stat.size")):
        found.append(("entry.size", str(probe.get("stat.size")), size))
    mode, bits = answer.get("entry.mode"), probe.get("stat.mode")
    if isinstance(mode, int) and isinstance(bits, str) and bits.isdigit() and mode & 0o777 != int(bits, 8) & 0o777:
        found.append(("entry.mode", int(bits, 8) & 0o777, mode))
    for name in ("owner", "group"):
        value = answer.get(f"entry.{name}")
        if value is not None and value != probe.get(f"stat.{name}"):
            found.append((f"entry.{name}", probe.get(f"stat.{name}"), value))
    moment, mtime = answer.get("entry.modifiedTime"), probe.get("stat.mtime")
    if isinstance(moment, str) and isinstance(mtime, str) and not _same_moment(moment, mtime):
        found.append(("entry.modifiedTime", mtime, moment))
    return found


def metrics_against_sandbox(answer: dict[str, Any], probe: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """(field path, what the sandbox says, what the last sample says) for each figure the sandbox contradicts."""
    found: list[tuple[str, Any, Any]] = []
    for name in ("cpuCount", "memTotal", "diskTotal", "diskUsed"):
        samples, real = answer.get(f"[].{name}"), probe.get(f"metrics.{name}")
        if not isinstance(samples, list) or not samples or not isinstance(real, int):
            continue
        value = samples[-1]
        if not isinstance(value, int | float) or isinstance(value, bool):
            continue
        if name == "cpuCount":
            wrong = value != real
        elif name == "diskUsed" and min(value, real) < MIB:
            wrong = False
        else:
            low, high = sorted((float(value), float(real)))
            loose = name == "memTotal" and probe.get("metrics.memFrom") != "cgroup"
            wrong = low <= 0 or high / low > (UNITS if loose else MAGNITUDE)
        if wrong:
            found.append((f"[].{name}", real, value))
    return found
