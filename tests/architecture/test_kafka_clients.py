"""Every Kafka client gets its connection settings from :mod:`sidecar.kafka_clients`.

A client built with its own ``bootstrap_servers=``, TLS or SASL keywords would silently miss the
next connection option (a new SASL mechanism, a timeout) that the one module gains.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ONE_PLACE = ROOT / "sidecar" / "kafka_clients.py"
CLIENTS = {"AIOKafkaProducer", "AIOKafkaConsumer", "AIOKafkaAdminClient"}
CONNECTION_KEYWORDS = {
    "bootstrap_servers",
    "client_id",
    "request_timeout_ms",
    "security_protocol",
    "ssl_context",
    "sasl_mechanism",
    "sasl_plain_username",
    "sasl_plain_password",
    "sasl_kerberos_service_name",
}


# A producer of the sidecar's own records takes acks and idempotence from durable_producer_kwargs
# (the processing guarantee); only the broker probe asks for idempotence whatever the guarantee,
# since finding out whether the brokers can give it is its job.
DURABILITY_KEYWORDS = {"enable_idempotence"}
PROBE = ROOT / "sidecar" / "source" / "capabilities.py"


def _name(func: ast.expr) -> str:
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else ""


def offenders(paths: list[Path], root: Path = ROOT) -> list[str]:
    found = []
    for path in paths:
        if path == ONE_PLACE:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            name = _name(node.func)
            where = f"{path.relative_to(root)}:{node.lineno}"
            if name == "create_ssl_context":
                found.append(f"{where}: builds its own TLS context")
            elif name in CLIENTS:
                own = sorted(k.arg for k in node.keywords if k.arg in CONNECTION_KEYWORDS)
                if own:
                    found.append(f"{where}: {name} with its own {', '.join(own)}")
                durability = sorted(k.arg for k in node.keywords if k.arg in DURABILITY_KEYWORDS)
                if durability and path != PROBE:
                    found.append(f"{where}: {name} with its own {', '.join(durability)}")
    return found


def test_kafka_clients_take_their_connection_from_one_module() -> None:
    paths = sorted(p for package in ("sidecar", "adapters") for p in (ROOT / package).rglob("*.py"))
    assert offenders(paths) == []


def test_the_check_sees_a_client_with_its_own_brokers(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from aiokafka import AIOKafkaProducer\np = AIOKafkaProducer(bootstrap_servers='h:9092', acks='all')\n"
    )
    eager = tmp_path / "eager.py"
    eager.write_text("from aiokafka import AIOKafkaProducer\np = AIOKafkaProducer(**kw, enable_idempotence=True)\n")
    sneaky = tmp_path / "sneaky.py"
    sneaky.write_text("import aiokafka.helpers as h\nctx = h.create_ssl_context(cafile='ca.pem')\n")
    assert offenders([bad, eager, sneaky], root=tmp_path) == [
        "bad.py:2: AIOKafkaProducer with its own bootstrap_servers",
        "eager.py:2: AIOKafkaProducer with its own enable_idempotence",
        "sneaky.py:2: builds its own TLS context",
    ]
