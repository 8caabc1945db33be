"""The embedded endpoint keeps freed heap for the next body pieces instead of faulting it in again.

An upload's pieces (256 KiB each, a few MiB alive at once) are allocated and freed per request; glibc by
default hands the top of the heap back after each round and faults every page in again for the next. The
check is the kernel's own count of the process's page faults (a second path, not the setting's return).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHURN = """
import json, resource, sys
from bench.localbox.server import keep_freed_heap
kept = keep_freed_heap() if sys.argv[1] == "kept" else None
PIECE, PIECES = 256 << 10, 12  # a 3 MiB window of body pieces, as an upload holds them

def one_round():
    pieces = [bytes([n % 251]) * PIECE for n in range(PIECES)]
    del pieces

for _ in range(5):  # the heap reaches its size
    one_round()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(40):
    one_round()
print(json.dumps({"kept": kept, "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before}))
"""

ROUND_PAGES = 12 * (256 << 10) // 4096  # the pages one round touches


def churn(mode: str) -> dict:
    done = subprocess.run([sys.executable, "-c", CHURN, mode], cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def test_freed_body_pieces_are_reused_without_new_page_faults() -> None:
    default, kept = churn("default"), churn("kept")
    assert kept["kept"] is True, "glibc's mallopt was not found or refused the settings"
    # by default every round gives the heap back and faults it in again: 40 rounds touch 40x its pages
    assert default["faults"] >= 20 * ROUND_PAGES, default
    # kept: 40 rounds fault in less than one round's pages
    assert kept["faults"] < ROUND_PAGES, kept
