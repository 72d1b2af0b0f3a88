"""Where the full conversation corpora are, for the few tests that rebuild committed artifacts
from them (the demo sample, the adapters' reports). Everything else uses data inside the repo.

Fixture ``corpora``: the datasets directory (``$SIDECAR_SHARED_DIR/datasets``, by default
``../shared/datasets`` beside the clone). Without it a test that asks for it is skipped with the
instructions below, so a clone of the repository alone passes its suite; ``SIDECAR_REQUIRE_CORPORA=1``
turns the absence into a failure, for a CI that must run them.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
REQUIRE_ENV = "SIDECAR_REQUIRE_CORPORA"
HOW_TO_GET = (
    "needs the conversation corpora (SGD, MultiWOZ, STAR, OptimouseQuest, tau-bench airline in the "
    "shared JSONL schema) at $SIDECAR_SHARED_DIR/datasets (default ../shared/datasets beside the clone); "
    "this test rebuilds a committed artifact from them and checks it is byte-identical"
)


def corpora_dir() -> Path:
    env = os.environ.get("SIDECAR_SHARED_DIR")
    return (Path(env) if env else REPO.parent / "shared") / "datasets"


@pytest.fixture(scope="session")
def corpora() -> Path:
    path = corpora_dir()
    if not path.is_dir():
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"{path} is missing: {HOW_TO_GET}")
        pytest.skip(f"{path} is missing: {HOW_TO_GET}")
    return path
