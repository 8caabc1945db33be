"""Which secrets are inside this sandbox: in any process's environment or arguments, or in any file changed
since the sandbox was created (a template file nobody changed cannot hold a run's credentials). Run as root by
the computer suite (computer.mjs, co09_no_credentials_inside), standard library only.

Arguments: the creation time (epoch seconds, less a margin for clock skew), a random pad (hex), then each secret
XOR the pad (hex), so this process's own arguments never hold a secret. Stdin: paths that must be among those
scanned (the seeds), as a check that the scan saw the files the run wrote.
Prints `<files scanned> <1 if every given path was scanned, else 0>`, then one line `<secret index> <where>`
per finding.
"""

import os
import sys

since, pad = float(sys.argv[1]), bytes.fromhex(sys.argv[2])
secrets = [bytes(a ^ b for a, b in zip(bytes.fromhex(masked), pad, strict=False)) for masked in sys.argv[3:]]
found: set[str] = set()
scanned: list[str] = []


def check(where: str, data: bytes) -> None:
    for index, secret in enumerate(secrets):
        if secret in data:
            found.add(f"{index} {where}")


for pid in filter(str.isdigit, os.listdir("/proc")):
    for part in ("environ", "cmdline"):
        try:
            with open(f"/proc/{pid}/{part}", "rb") as f:
                check(f"/proc/{pid}/{part}", f.read())
        except OSError:
            pass
for top, dirs, names in os.walk("/"):
    if top == "/":
        dirs[:] = [d for d in dirs if d not in ("proc", "sys", "dev")]
    for name in names:
        path = os.path.join(top, name)
        try:
            info = os.lstat(path)
            if not os.path.isfile(path) or os.path.islink(path) or info.st_ctime < since:
                continue
            with open(path, "rb") as f:
                scanned.append(path)
                tail = b""
                while chunk := f.read(1 << 20):
                    check(path, tail + chunk)  # a secret across two reads is seen in the joined bytes
                    tail = chunk[-256:]
        except OSError:
            pass
print(len(scanned), int(all(seed in scanned for seed in sys.stdin.read().split())))
print("\n".join(sorted(found)))
