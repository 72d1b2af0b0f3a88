"""Suite-wide fixtures and plugins."""

from __future__ import annotations

pytest_plugins: list[str] = ["tests.support.vllm_server"]
