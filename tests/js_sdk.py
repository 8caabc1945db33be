"""The pinned npm SDK driven from a test: a short async body run by Node, its result read back as JSON."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from bench.runners.node import NODE_RUNNERS, ensure_node_env, find_node, project_of

NODE_SDK = NODE_RUNNERS["js-e2b-2.51.0"]


def run_js(body: str, tmp_path: Path, **values: Any) -> Any:
    """Run `body` (an async function body with `Sandbox` and `values` in scope) with the pinned npm SDK."""
    modules = ensure_node_env(project_of(NODE_SDK)) / "node_modules"
    script = tmp_path / "probe.mjs"
    script.write_text(
        f"import {{ Sandbox }} from {json.dumps(str(modules / 'e2b' / 'dist' / 'index.mjs'))};\n"
        f"const values = {json.dumps(values)};\n"
        f"const result = await (async () => {{ {body} }})();\n"
        "process.stdout.write(JSON.stringify(result ?? null));\n"
    )
    done = subprocess.run([str(find_node()), str(script)], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)
