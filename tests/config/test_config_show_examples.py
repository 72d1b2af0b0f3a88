"""``sidecar config show`` on every configuration the repository documents or ships.

The examples are found, not listed: every fenced YAML (or unlabelled) block of the Markdown files
whose top-level keys are all sections of the config tree, and the chart's rendered ConfigMap in
``deploy/kubernetes/``. ``config show`` must print each one, and what it prints, read back as a
config file, must be the same effective configuration (so a path or a URL is printed as the
config file spells it).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_origin

import pytest
import yaml
from pydantic import BaseModel, SecretStr

from sidecar.cli import main
from sidecar.config import MASK, SidecarConfig, dump_yaml, load_config

REPO = Path(__file__).resolve().parents[2]
_FENCE = re.compile(r"^```([A-Za-z0-9_-]*)[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
_SECTIONS = frozenset(SidecarConfig.model_fields)


def _markdown_files() -> list[Path]:
    skip = {".venv", ".tools", "node_modules", ".git"}
    return sorted(p for p in REPO.rglob("*.md") if not skip & set(p.relative_to(REPO).parts))


def _doc_examples() -> Iterator[tuple[str, str]]:
    for path in _markdown_files():
        text = path.read_text(encoding="utf-8")
        for match in _FENCE.finditer(text):
            if match.group(1) not in ("", "yaml", "yml"):
                continue
            try:
                data = yaml.safe_load(match.group(2))
            except yaml.YAMLError:
                continue  # not YAML: a shell session or a diagram
            if isinstance(data, dict) and data and set(data) <= _SECTIONS:
                line = text.count("\n", 0, match.start()) + 1
                yield f"{path.relative_to(REPO)}:{line}", match.group(2)


def _shipped_examples() -> Iterator[tuple[str, str]]:
    for path in sorted((REPO / "deploy").rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if isinstance(doc, dict) and doc.get("kind") == "ConfigMap":
                for key, value in (doc.get("data") or {}).items():
                    if key.endswith((".yaml", ".yml")):
                        yield f"{path.relative_to(REPO)}[{key}]", value


EXAMPLES = dict([*_doc_examples(), *_shipped_examples()])


def test_the_examples_are_found() -> None:
    # The documented secure config (its listeners with web-config files) and the shipped manifests:
    # if the scan stopped finding them, the test below would check nothing.
    assert any(name.startswith("docs/security.md:") for name in EXAMPLES), sorted(EXAMPLES)
    assert any(name.startswith("docs/opentelemetry.md:") for name in EXAMPLES), sorted(EXAMPLES)
    assert any(name.startswith("deploy/kubernetes/configmap.yaml") for name in EXAMPLES), sorted(EXAMPLES)
    assert any("web_config_file" in text for text in EXAMPLES.values())


SECRET = "s3cret-value"


def _secret_fields(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every secret of the tree: its dotted path and its annotation (a SecretStr, or a list or a
    mapping of them)."""
    for name, field in model.model_fields.items():
        annotation: Any = field.annotation
        args = getattr(annotation, "__args__", ())
        if annotation is SecretStr or SecretStr in args:
            yield (*prefix, name), annotation
        for candidate in (annotation, *args):
            if isinstance(candidate, type) and issubclass(candidate, BaseModel):
                yield from _secret_fields(candidate, (*prefix, name))


SECRETS = list(_secret_fields(SidecarConfig))


def _secret_env(i: int, annotation: Any) -> str:
    value = f"{SECRET}-{i}-{'x' * 32}"
    origin = get_origin(annotation)
    if origin is list:
        return json.dumps([value])
    if origin is dict:
        return json.dumps({"authorization": value})
    return value


@pytest.fixture
def secrets_in_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No SIDECAR_* variable of this process, and every secret of the tree set through its
    environment variable, as the docs tell the operator to (the examples leave them out)."""
    for key in [k for k in os.environ if k.startswith("SIDECAR_")]:
        monkeypatch.delenv(key)
    for i, (path, annotation) in enumerate(SECRETS):
        monkeypatch.setenv("SIDECAR_" + "__".join(p.upper() for p in path), _secret_env(i, annotation))


def test_the_secrets_are_found() -> None:
    names = {".".join(path) for path, _ in SECRETS}
    assert {"kafka.sasl_password", "otel.receiver.bearer_token", "evaluations.otlp.headers"} <= names


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_config_show_prints_every_example(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], secrets_in_env: None
) -> None:
    source = tmp_path / "example.yaml"
    source.write_text(EXAMPLES[name], encoding="utf-8")
    assert main(["config", "show", "--config", str(source)]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    assert SECRET not in captured.out
    assert captured.out.count(MASK) >= len(SECRETS)
    # Read back (the environment supplies the masked secrets again), the same configuration.
    shown = tmp_path / "shown.yaml"
    shown.write_text(captured.out, encoding="utf-8")
    assert load_config(shown) == load_config(source)


def test_paths_and_urls_are_printed_as_written_and_masked(tmp_path: Path, secrets_in_env: None) -> None:
    source = tmp_path / "c.yaml"
    source.write_text(
        yaml.safe_dump(
            {
                "http": {
                    "port": 9108,
                    "scrape": {"web_config_file": str(tmp_path / "scrape.yml")},
                    "operator": {"port": 9109, "web_config_file": str(tmp_path / "operator.yml")},
                },
                "scoring": {"vllm": {"base_url": "http://user:pw-in-url@vllm:8000/v1?api_key=key-in-query"}},
                # A webhook URL whose path is the credential: the chart keeps it in its Secret.
                "alerting": {"sinks": {"webhook": {"url": "https://hooks.example.com/services/T0/B0/tok3n-in-path"}}},
            }
        ),
        encoding="utf-8",
    )
    out = dump_yaml(load_config(source))
    assert SECRET not in out
    assert "pw-in-url" not in out and "key-in-query" not in out and "tok3n-in-path" not in out
    assert yaml.safe_load(out)["alerting"]["sinks"]["webhook"]["url"] == f"https://hooks.example.com/{MASK}"
    assert f"web_config_file: {tmp_path / 'operator.yml'}" in out
    assert yaml.safe_load(out)["http"]["scrape"]["web_config_file"] == str(tmp_path / "scrape.yml")
