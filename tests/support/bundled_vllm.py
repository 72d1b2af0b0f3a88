"""A real vLLM server (CPU build) on the bundled, trained model, as a pytest plugin.

Fixture ``bundled_vllm`` (session scope): the base model and completion adapter committed under
``adapters/artifacts/``, served as ``sidecar demo`` serves them (``sidecar.tools.demo.models``), and
the scoring configuration the demo uses (:func:`scoring_config`). Claims about what the bundled
model does on real conversations (structure forgery, the uncertain-turn rate) are tested on it;
protocol tests use the tiny random model of :mod:`tests.support.vllm_server` instead.

Started on first use only, once per session (1-2 minutes on two cores). A missing vLLM
interpreter or bundled model is a test *error*, never a skip. Development shortcut: export
``SIDECAR_TEST_BUNDLED_VLLM_URL=http://127.0.0.1:PORT`` to attach to a server already running the
same artifacts.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from sidecar.scoring.config import ScoringConfig
from sidecar.tools.demo import models

ATTACH_ENV = "SIDECAR_TEST_BUNDLED_VLLM_URL"


@dataclass(frozen=True)
class BundledVllm:
    root_url: str

    @property
    def base_url(self) -> str:
        return self.root_url + "/v1"

    def scoring_config(self, **overrides: Any) -> ScoringConfig:
        """The demo's scoring configuration, pointed at this server."""
        base, adapter = models.bundled_model() or (None, None)
        assert base is not None and adapter is not None
        cfg = models.demo_scoring_config(self.base_url, base, adapter)
        for key, value in overrides.items():
            cfg[key] = {**cfg[key], **value} if isinstance(value, dict) and isinstance(cfg.get(key), dict) else value
        return ScoringConfig.model_validate(cfg)


@pytest.fixture(scope="session")
def bundled_vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BundledVllm]:
    attach = os.environ.get(ATTACH_ENV)
    if attach:
        yield BundledVllm(attach.rstrip("/"))
        return
    reason = models.scoring_unavailable_reason()
    if reason is not None:
        raise RuntimeError(f"the bundled model cannot be served: {reason}")
    server = models.local_server(tmp_path_factory.mktemp("bundled-vllm") / "vllm.log")
    server.start()
    try:
        server.wait_ready_blocking()
        yield BundledVllm(server.root_url)
    finally:
        server.stop()
