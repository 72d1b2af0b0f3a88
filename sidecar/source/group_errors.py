"""Which consumer-group errors a member lives through, and which end it.

aiokafka's group coordinator wraps an error code its protocol handling does not expect (a
``SyncGroup`` answered ``INVALID_REQUEST``, an unknown JoinGroup or heartbeat error, an assignor
failure) in a plain :class:`~aiokafka.errors.KafkaError`, hands it to the consumer once (from
``start()`` while waiting for the first assignment, else from the next ``getmany()``), and goes on
coordinating: it rejoins the group on its next turn. A broker racing two members' syncs produces
one (librdkafka's mock cluster answers a follower's late ``SyncGroup`` that way). Ending the
process there turns a rejoin into a crash loop; the member logs it and rejoins instead.

What ends the member: authorization failures (their own error types), and the coordinator task
itself failing ("Unexpected error during coordination"), after which nothing rejoins.
"""

from __future__ import annotations

from aiokafka.errors import KafkaError

# aiokafka's text when its coordination task has died: the consumer will not rejoin.
COORDINATION_DEAD = "during coordination"


def survivable_group_error(exc: BaseException) -> bool:
    """Whether ``exc`` is a group error after which the consumer rejoins by itself."""
    return type(exc) is KafkaError and COORDINATION_DEAD not in str(exc)
