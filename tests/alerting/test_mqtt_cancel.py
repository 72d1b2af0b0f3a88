"""The MQTT sink's reconnect loop ends when stopped even if aiomqtt swallowed the cancellation.

CI hung 600 s in ``test_tls_and_password_authentication``: stopping a sink whose broker refused
its password cancelled the loop as the refusal arrived; aiomqtt's ``asyncio.wait_for`` (Python
3.11, CPython gh-86296) dropped the cancel and the loop reconnected for ever.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from sidecar.alerting.sinks.mqtt import _raise_if_cancel_swallowed


async def test_a_swallowed_cancel_is_raised_again() -> None:
    reached = asyncio.Event()

    async def loop_body() -> None:
        # What aiomqtt's connect does when the broker's refusal lands with the cancel:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(10)
        _raise_if_cancel_swallowed()
        reached.set()  # the reconnect loop would go on here
        await asyncio.sleep(10)

    task = asyncio.create_task(loop_body())
    await asyncio.sleep(0)
    task.cancel()
    async with asyncio.timeout(5):
        with pytest.raises(asyncio.CancelledError):
            await task
    assert not reached.is_set()


async def test_no_cancel_no_raise() -> None:
    _raise_if_cancel_swallowed()  # a running task nobody cancelled goes on
