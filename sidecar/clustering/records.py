"""The two records a fleet of replicas shares goal clustering through (see docs/fleet.md).

* :class:`GoalInput`: one ended conversation's goal summary and unit embedding, written by the
  replica that saw the conversation to the inputs topic, read by every replica into its reservoir.
* :class:`FleetGoalModel`: the fleet's goal model (ids, names, sizes, centroids and the id counter),
  written by the leader to a compacted topic under one key, read by every replica, which assigns
  goals from the latest one it accepted. It carries the leader's term generation and its own version:
  :func:`sidecar.fleet.table.fenced` keeps a paused leader's late model from replacing its
  successor's.

Both are untrusted input on the way in: :func:`decode_input` and :func:`decode_model` check every
field (types, bounds, finite unit-scale vectors, one dimension for all centroids) and raise
:class:`~sidecar.fleet.table.InvalidRow` with what is wrong, never anything else.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from dataclasses import dataclass
from typing import Any, Final, Literal

import numpy as np
import numpy.typing as npt

from sidecar.fleet.table import InvalidRow

SCHEMA: Final = 1
MAX_CLUSTERS: Final = 1_000
MAX_DIMENSIONS: Final = 8_192
MAX_ID_CHARS: Final = 64
MAX_LABEL_CHARS: Final = 200
MAX_SUMMARY_CHARS: Final = 20_000
MAX_CONVERSATION_ID_CHARS: Final = 512
_ID = re.compile(r"[A-Za-z0-9_.-]{1,64}")
# Unit vectors, stored as float32: a component beyond this is no unit vector's.
_MAX_COMPONENT = 1.0 + 1e-3

Vector = npt.NDArray[np.float32]
# What became of a leader's model write: ``not_leader`` is a correct step-down (this replica does not
# lead any more, or a newer term's model is on the topic), not a failure.
Published = Literal["published", "not_leader", "publish_error"]


@dataclass(frozen=True, slots=True)
class GoalInput:
    conversation_id: str
    summary: str
    vector: Vector


@dataclass(frozen=True, slots=True)
class ModelCluster:
    """One cluster of the fleet model: ``label`` is None while it is too small to be named."""

    id: str
    label: str | None
    size: int
    centroid: Vector


@dataclass(frozen=True, slots=True)
class FleetGoalModel:
    """A fenced row (``generation``, ``version``); clusters largest first. New ids are ``prefix``
    (chosen at random by the fleet's first leader) and a number from ``next_number`` on: a
    successor continues the counter, so an id is never handed out twice."""

    generation: int
    version: int
    prefix: str
    next_number: int
    clusters: tuple[ModelCluster, ...]


def _vector_text(v: Vector) -> str:
    return base64.b64encode(np.ascontiguousarray(v, dtype="<f4").tobytes()).decode("ascii")


def _vector(raw: object, what: str) -> Vector:
    if not isinstance(raw, str):
        raise InvalidRow(f"{what}: not a base64 string")
    try:
        data = base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRow(f"{what}: not base64") from None
    if not data or len(data) % 4 or len(data) // 4 > MAX_DIMENSIONS:
        raise InvalidRow(f"{what}: {len(data)} bytes is not 1 to {MAX_DIMENSIONS} float32 values")
    v = np.frombuffer(data, dtype="<f4").astype(np.float32)
    if not np.all(np.isfinite(v)) or float(np.max(np.abs(v))) > _MAX_COMPONENT:
        raise InvalidRow(f"{what}: not a finite unit vector")
    return v


def _int(raw: object, what: str, low: int, high: int = 2**62) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int) or not low <= raw <= high:
        raise InvalidRow(f"{what}: not an integer in [{low}, {high}]")
    return raw


def _text(raw: object, what: str, max_chars: int) -> str:
    if not isinstance(raw, str) or not raw or len(raw) > max_chars:
        raise InvalidRow(f"{what}: not a string of 1 to {max_chars} characters")
    return raw


def _object(value: bytes) -> dict[str, Any]:
    try:
        obj = json.loads(value)
    except (ValueError, RecursionError):
        raise InvalidRow("not JSON") from None
    if not isinstance(obj, dict):
        raise InvalidRow("not a JSON object")
    if obj.get("schema") != SCHEMA:
        raise InvalidRow(f"schema {obj.get('schema')!r}, this replica reads {SCHEMA}")
    return obj


def encode_input(item: GoalInput) -> bytes:
    return json.dumps(
        {"schema": SCHEMA, "id": item.conversation_id, "summary": item.summary, "vector": _vector_text(item.vector)},
        ensure_ascii=False,
    ).encode("utf-8")


def decode_input(value: bytes) -> GoalInput:
    obj = _object(value)
    cid = _text(obj.get("id"), "id", MAX_CONVERSATION_ID_CHARS)
    summary = _text(obj.get("summary"), "summary", MAX_SUMMARY_CHARS)
    vector = _vector(obj.get("vector"), "vector")
    if not _is_unit(vector):
        raise InvalidRow("vector: not a unit vector")
    return GoalInput(cid, summary, vector)


def _is_unit(v: Vector) -> bool:
    return math.isclose(float(np.linalg.norm(v)), 1.0, abs_tol=1e-2)


def encode_model(model: FleetGoalModel) -> bytes:
    return json.dumps(
        {
            "schema": SCHEMA,
            "generation": model.generation,
            "version": model.version,
            "prefix": model.prefix,
            "next_number": model.next_number,
            "clusters": [
                {"id": c.id, "label": c.label, "size": c.size, "centroid": _vector_text(c.centroid)}
                for c in model.clusters
            ],
        },
        ensure_ascii=False,
    ).encode("utf-8")


def decode_model(value: bytes) -> FleetGoalModel:
    obj = _object(value)
    raw = obj.get("clusters")
    if not isinstance(raw, list) or len(raw) > MAX_CLUSTERS:
        raise InvalidRow(f"clusters: not a list of at most {MAX_CLUSTERS}")
    clusters: list[ModelCluster] = []
    for i, c in enumerate(raw):
        if not isinstance(c, dict):
            raise InvalidRow(f"clusters[{i}]: not an object")
        cid = _text(c.get("id"), f"clusters[{i}].id", MAX_ID_CHARS)
        if not _ID.fullmatch(cid):
            raise InvalidRow(f"clusters[{i}].id: not an id")
        raw_label = c.get("label")
        label = None if raw_label is None else _text(raw_label, f"clusters[{i}].label", MAX_LABEL_CHARS)
        size = _int(c.get("size"), f"clusters[{i}].size", 0)
        clusters.append(ModelCluster(cid, label, size, _vector(c.get("centroid"), f"clusters[{i}].centroid")))
    if len({c.id for c in clusters}) != len(clusters):
        raise InvalidRow("clusters: an id appears twice")
    if len({c.centroid.shape[0] for c in clusters}) > 1:
        raise InvalidRow("clusters: centroids of different dimensions")
    if not all(_is_unit(c.centroid) for c in clusters):
        raise InvalidRow("clusters: a centroid is not a unit vector")
    prefix = _text(obj.get("prefix"), "prefix", MAX_ID_CHARS)
    if not _ID.fullmatch(prefix):
        raise InvalidRow("prefix: not an id prefix")
    return FleetGoalModel(
        generation=_int(obj.get("generation"), "generation", 0),
        version=_int(obj.get("version"), "version", 0),
        prefix=prefix,
        next_number=_int(obj.get("next_number"), "next_number", 1),
        clusters=tuple(clusters),
    )
