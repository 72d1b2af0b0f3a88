"""Creating a fleet table's compacted topic when it does not exist yet.

Production clusters often forbid topic creation by applications (ACLs, GitOps-managed topics):
then the operator creates the topic (the chart's values name it) and the sidecar only reads it.
Otherwise the sidecar creates a missing topic itself: compacted, one partition (a table's rows are
read in one order), with the replication factor given (aiokafka's CreateTopics request cannot ask
for the broker's default).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

import structlog
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError, TopicAlreadyExistsError, for_code

from sidecar.kafka_clients import client_kwargs
from sidecar.source.config import KafkaConfig

log = structlog.get_logger(__name__)

COMPACTED: Final = {"cleanup.policy": "compact"}


async def ensure_compacted_topic(
    kafka: KafkaConfig, topic: str, *, replication_factor: int, configs: Mapping[str, str] = COMPACTED
) -> bool:
    """Create ``topic`` (compacted, one partition; ``configs`` replace the compaction setting)
    unless it exists; True when it exists afterwards.

    Never raises for a Kafka error: a refusal (not authorised, a policy) is logged, and the
    table then waits for the topic as for any other outage (its ``/readyz`` detail says so)."""
    admin = AIOKafkaAdminClient(**client_kwargs(kafka, client_id=f"{kafka.client_id}-admin"))
    try:
        await admin.start()
        response = await admin.create_topics([NewTopic(topic, 1, replication_factor, topic_configs=dict(configs))])
    except (KafkaError, AttributeError) as exc:
        # AttributeError: aiokafka's admin client on a cluster that names no controller (librdkafka's
        # mock cluster, which creates topics on first produce instead).
        log.warning("fleet.topic_not_created", topic=topic, error=type(exc).__name__)
        return False
    finally:
        await admin.close()
    # Per-topic answers come back as error codes, not exceptions.
    codes = [entry[1] for entry in response.topic_errors]
    if codes == [0]:
        log.info("fleet.topic_created", topic=topic)
        return True
    if codes == [TopicAlreadyExistsError.errno]:
        return True
    error = for_code(codes[0]).__name__ if codes else "no answer"
    log.warning("fleet.topic_not_created", topic=topic, error=error)
    return False
