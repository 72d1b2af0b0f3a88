"""The one configuration tree.

Sources, highest priority first: explicit overrides, ``SIDECAR_<SECTION>__<FIELD>`` environment
variables, the YAML file (``--config`` or ``SIDECAR_CONFIG_FILE``), defaults. Every section is a
frozen pydantic model with ``extra="forbid"``: a typo is an error, not a silently ignored key.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import yaml
from pydantic import ConfigDict, Field, SecretStr, ValidationError, model_validator
from pydantic_core import to_jsonable_python
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from sidecar.alerting.config import AlertingConfig
from sidecar.clustering.config import ClusteringConfig
from sidecar.errors import ConfigError
from sidecar.evaluations.config import EvaluationsConfig
from sidecar.judge.config import JudgeConfig
from sidecar.otel.config import OtelConfig
from sidecar.scoring.config import ScoringConfig
from sidecar.source.config import KafkaConfig
from sidecar.state.config import StateConfig
from sidecar.telemetry.config import HttpConfig, LoggingConfig
from sidecar.training_store.config import TrainingStoreConfig
from sidecar.trees.config import TreeViewConfig

CONFIG_FILE_ENV = "SIDECAR_CONFIG_FILE"
MAX_CONFIG_FILE_BYTES = 1_048_576
MASK = "**********"


class SidecarConfig(BaseSettings):
    """Everything the sidecar can be told. See docs/configuration.md."""

    model_config = SettingsConfigDict(
        env_prefix="SIDECAR_",
        env_nested_delimiter="__",
        frozen=True,
        extra="forbid",
        case_sensitive=False,
    )

    kafka: KafkaConfig = Field(default_factory=KafkaConfig)
    state: StateConfig = Field(default_factory=StateConfig)
    http: HttpConfig = Field(default_factory=HttpConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    scoring: ScoringConfig = Field(default_factory=ScoringConfig)
    clustering: ClusteringConfig = Field(default_factory=ClusteringConfig)
    alerting: AlertingConfig = Field(default_factory=AlertingConfig)
    judge: JudgeConfig = Field(default_factory=JudgeConfig)
    tree_view: TreeViewConfig = Field(default_factory=TreeViewConfig)
    training_store: TrainingStoreConfig = Field(default_factory=TrainingStoreConfig)
    evaluations: EvaluationsConfig = Field(default_factory=EvaluationsConfig)
    otel: OtelConfig = Field(default_factory=OtelConfig)

    @model_validator(mode="after")
    def _alerts_topic_is_its_own(self) -> SidecarConfig:
        sink = self.alerting.sinks.kafka
        taken = {self.kafka.topic, self.kafka.results_topic, self.kafka.dead_letter_topic}
        if sink.enabled and sink.topic in taken:
            raise ValueError("alerting.sinks.kafka.topic must differ from the source, results and dead-letter topics")
        if self.otel.bridge.enabled and self.otel.bridge.topic in taken:
            raise ValueError("otel.bridge.topic must differ from the source, results and dead-letter topics")
        store = self.training_store
        if store.enabled and store.backend == "kafka" and store.topic_for(self.kafka.topic) in taken:
            raise ValueError("training_store.topic must differ from the source, results and dead-letter topics")
        fleet = self.clustering.fleet
        if self.clustering.enabled and fleet.enabled:
            model_topic, inputs_topic = fleet.topics(self.kafka.topic)
            if model_topic == inputs_topic or {model_topic, inputs_topic} & taken:
                raise ValueError(
                    "clustering.fleet's model and inputs topics must differ from each other and from the source, "
                    "results and dead-letter topics"
                )
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        del settings_cls, dotenv_settings, file_secret_settings
        # Only init (which carries the parsed YAML, merged under explicit overrides) and env:
        # no dotenv, no secrets dir, so nothing is read from places the operator did not name.
        return (env_settings, init_settings)


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
    if size > MAX_CONFIG_FILE_BYTES:
        raise ConfigError(f"config file {path} is {size} bytes; the limit is {MAX_CONFIG_FILE_BYTES}")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid UTF-8") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {_yaml_problem(exc)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping at top level, not {type(data).__name__}")
    return data


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """What is wrong and where, never the offending line itself (it may hold a secret)."""
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        return f"{exc.problem or exc.context or 'syntax error'}{where}"
    return type(exc).__name__


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def format_validation_error(exc: ValidationError) -> str:
    """One line per problem: dotted location, what is wrong, the env var that sets it."""
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"])
        env = "SIDECAR_" + "__".join(str(p).upper() for p in err["loc"])
        lines.append(f"  {loc}: {err['msg']} (env {env})")
    return "invalid configuration:\n" + "\n".join(lines)


def load_config(path: Path | None = None, overrides: dict[str, Any] | None = None) -> SidecarConfig:
    """Build the effective configuration or raise :class:`ConfigError` with every problem listed."""
    if path is None and os.environ.get(CONFIG_FILE_ENV):
        path = Path(os.environ[CONFIG_FILE_ENV])
    data = _read_yaml(path) if path is not None else {}
    if overrides:
        data = _deep_merge(data, overrides)
    try:
        return SidecarConfig(**data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc)) from exc


# Credentials that ride inside a URL: ``scheme://user:password@host`` and the usual query keys.
_URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/@\s]+@")
_URL_SECRET_QUERY = re.compile(
    r"(?i)([?&](?:api[_-]?key|key|token|access[_-]?token|auth|password|passwd|secret|sig|signature)=)[^&#\s]*"
)


def mask_url_credentials(text: str) -> str:
    """``text`` with any credentials embedded in URLs replaced by the mask."""
    return _URL_SECRET_QUERY.sub(rf"\1{MASK}", _URL_USERINFO.sub(rf"\1{MASK}@", text))


def _mask(value: Any) -> Any:
    """Plain YAML data (str, int, float, bool, None, lists, mappings), every secret masked."""
    if isinstance(value, SecretStr):
        return MASK if value.get_secret_value() else ""
    if isinstance(value, str):
        return mask_url_credentials(value)
    if value is None or isinstance(value, bool | int | float):
        return value  # floats stay floats: YAML writes .inf where JSON would lose it
    if isinstance(value, dict):
        return {k: _mask(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        items = [_mask(v) for v in value]
        return items if isinstance(value, list | tuple) else sorted(items, key=repr)
    # Anything else (a Path, a URL, an enum, a date) in the form the config file would spell it,
    # then masked like any other string: `config show` never fails on a field's type.
    return _mask(to_jsonable_python(value, fallback=str))


# URLs whose path is itself the credential (a Slack-style webhook: whoever knows it can post); the
# chart carries them in its Secret. Printed as scheme and host only.
_CAPABILITY_URLS: tuple[tuple[str, ...], ...] = (("alerting", "sinks", "webhook", "url"),)


def _mask_capability_url(url: str) -> str:
    parts = urlsplit(url)
    if not (parts.path.strip("/") or parts.query or parts.fragment):
        return url
    return urlunsplit((parts.scheme, parts.netloc, "/" + MASK, "", ""))


def masked_dict(config: SidecarConfig) -> dict[str, Any]:
    """The effective configuration as plain data with every secret replaced by a mask."""
    raw = config.model_dump(mode="python")
    out = {k: _mask(v) for k, v in raw.items()}
    for *parents, leaf in _CAPABILITY_URLS:
        node = out
        for key in parents:
            node = node[key]
        if isinstance(node.get(leaf), str):
            node[leaf] = _mask_capability_url(node[leaf])
    return out


def dump_yaml(config: SidecarConfig) -> str:
    """``config show`` output: YAML, secrets masked."""
    return yaml.safe_dump(masked_dict(config), sort_keys=False)


__all__ = [
    "ConfigDict",
    "SidecarConfig",
    "dump_yaml",
    "format_validation_error",
    "load_config",
    "mask_url_credentials",
    "masked_dict",
]
