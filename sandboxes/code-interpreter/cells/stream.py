# ci03: stdout, stderr, stdout, each flushed. The cell waits (up to 20 s) for the file the runner's first
# stdout callback writes, so only output streamed while the cell runs lets it go on at once; its last
# line says when the file never came.
import os
import sys
import time

GO_FILE = "/tmp/e2b-bench-ci-go"
print("out-1", flush=True)
deadline = time.monotonic() + 20
while not os.path.exists(GO_FILE) and time.monotonic() < deadline:
    time.sleep(0.02)
print("err-1", file=sys.stderr, flush=True)
print("out-2" if os.path.exists(GO_FILE) else "out-2 (the callback never wrote the file)", flush=True)
