# ci09: the variable as the cell and a subprocess of it see it ("unset" when it is not set).
import os
import subprocess

shell = subprocess.check_output(["sh", "-c", 'printf %s "${E2B_BENCH_CI_VAR-unset}"'], text=True)
(os.environ.get("E2B_BENCH_CI_VAR", "unset"), shell)
