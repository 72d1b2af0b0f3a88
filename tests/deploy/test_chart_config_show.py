"""``sidecar config show`` on the configuration each chart scenario renders (helm/sidecar/ci/).

The secure scenario sets ``web_config_file`` on both listeners: the configuration an operator
following docs/security.md would inspect first.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path

import pytest
import yaml

from sidecar.cli import main
from sidecar.config import MASK, load_config
from tests.deploy.chart import by_kind, render, scenarios

SCENARIOS = scenarios()


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem.removesuffix("-values"))
def test_config_show_prints_the_rendered_configuration(
    helm: str, path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], clean_environment: None
) -> None:
    docs = render([path])
    maps = [d for d in by_kind(docs, "ConfigMap") if "sidecar.yaml" in (d.get("data") or {})]
    assert len(maps) == 1
    source = tmp_path / "sidecar.yaml"
    source.write_text(maps[0]["data"]["sidecar.yaml"], encoding="utf-8")
    secrets = {
        k: base64.b64decode(v).decode() for s in by_kind(docs, "Secret") for k, v in (s.get("data") or {}).items()
    }
    env = {k: v for k, v in secrets.items() if k.startswith("SIDECAR_")}
    if "existing" in path.name:
        env["SIDECAR_KAFKA__SASL_PASSWORD"] = "from-existing-secret"  # the operator's own Secret
    os.environ.update(env)

    assert main(["config", "show", "--config", str(source)]) == 0
    out = capsys.readouterr().out
    shown = yaml.safe_load(out)
    for value in env.values():
        if len(value) >= 8:  # a secret, not a port number or a flag
            assert value not in out
    if "secure" in path.name:
        assert shown["http"]["scrape"]["web_config_file"]
        assert shown["http"]["operator"]["web_config_file"]
    if env:
        assert MASK in out
    again = tmp_path / "shown.yaml"
    again.write_text(out, encoding="utf-8")
    assert load_config(again) == load_config(source)
