"""The SDK's optional httpx2 module is fully imported before the first request.

openai looks ``httpx2`` up in ``sys.modules`` on every request; if another thread were importing it
at that moment, the request would see a half-initialised module (AttributeError, seen in the demo
while the embedder loaded its model). Importing the client layer must import it first.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest


@pytest.mark.skipif(importlib.util.find_spec("httpx2") is None, reason="httpx2 is not installed here")
def test_importing_the_client_layer_loads_httpx2_completely() -> None:
    script = (
        "import sys\n"
        "assert 'httpx2' not in sys.modules\n"
        "import sidecar.llm.endpoint\n"
        "module = sys.modules.get('httpx2')\n"
        "print(module is not None and hasattr(module, 'Timeout'))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "True"
