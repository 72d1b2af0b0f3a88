"""Which consumer-group errors a replica lives through (sidecar/source/group_errors.py).

The real case: on librdkafka's mock cluster, three replicas joining at once sometimes have a
follower's late ``SyncGroup`` answered ``INVALID_REQUEST``; aiokafka hands that to the consumer as
a plain ``KafkaError`` and rejoins. tests/replicas/test_stall.py (mock cluster) met it and now
requires every replica to stay up through it.
"""

from __future__ import annotations

import pytest
from aiokafka.errors import (
    GroupAuthorizationFailedError,
    IllegalGenerationError,
    InvalidRequestError,
    KafkaConnectionError,
    KafkaError,
    TopicAuthorizationFailedError,
)

from sidecar.source.group_errors import survivable_group_error


@pytest.mark.parametrize(
    "exc",
    [
        KafkaError(repr(InvalidRequestError())),  # SyncGroup answered INVALID_REQUEST
        KafkaError("Unexpected exception in heartbeat task: UnknownError()"),
        KafkaError(repr(ValueError("assignor failed"))),
    ],
)
def test_a_wrapped_protocol_error_is_lived_through(exc: BaseException) -> None:
    assert survivable_group_error(exc)


@pytest.mark.parametrize(
    "exc",
    [
        # The coordinator task itself died: nothing rejoins, so the process must end.
        KafkaError("Unexpected error during coordination RuntimeError('boom')"),
        GroupAuthorizationFailedError("group"),
        TopicAuthorizationFailedError(),
        KafkaConnectionError("no broker"),
        IllegalGenerationError(),
        ValueError("not a Kafka error"),
    ],
)
def test_everything_else_still_ends_the_member(exc: BaseException) -> None:
    assert not survivable_group_error(exc)
