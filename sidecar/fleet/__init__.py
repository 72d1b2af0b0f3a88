"""State that must be the same on every replica, shared through Kafka.

* :mod:`sidecar.fleet.leadership`: which replica runs the jobs that must run once (the owner of
  source partition 0, per group generation).
* :mod:`sidecar.fleet.table`: every replica's copy of a table kept in a compacted topic, with
  fencing so an owner that lost its role cannot overwrite its successor's rows.
* :mod:`sidecar.fleet.publisher`: writing a row, acknowledged or raised.

See docs/fleet.md.
"""
