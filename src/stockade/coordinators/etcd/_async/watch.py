"""Waiting on etcd for one key's deletion: a streamed ``/v3/watch`` over the JSON gateway.

A waiter of the etcd port (`stockade.coordinators.etcd._async.port`) watches only the
queue key created just before its own, so a release wakes one waiter (C4).
The stream is a plain connection of its own (the gateway answers a watch as a
response that never ends), closed when the watch has said enough.
"""

from __future__ import annotations

import json
import time

from stockade.coordinators import etcd as recipe
from stockade.transport.http11 import build_request
from stockade.transport.io import AsyncIO

__all__ = ["wait_deleted"]

_WATCH_BYTES_MAX = 1 << 16


async def wait_deleted(member: recipe.EtcdMember, key: bytes, start_revision: int, timeout_s: float) -> bool:
    """Return when ``key`` is deleted at or after ``start_revision``, its watch ends, or ``timeout_s`` passes.

    Returns:
        False when ``member`` could not be reached (the caller moves to another), else True.
    """
    body = json.dumps({"create_request": {"key": recipe.b64(key), "start_revision": str(start_revision)}}).encode()
    request = build_request("POST", "/v3/watch", authority=f"{member.host}:{member.port}", auth_token=None,
                            body=body, content_type="application/json")
    deadline = time.monotonic() + timeout_s
    try:
        stream = await AsyncIO.open_tcp(member.host, member.port, tls=None, timeout_s=max(0.001, timeout_s))
    except OSError:
        return False
    try:
        await stream.send(request, max(0.001, timeout_s))
        seen = b""
        while True:
            remaining_s = deadline - time.monotonic()
            if remaining_s <= 0:
                return True
            data = await stream.receive(_WATCH_BYTES_MAX, remaining_s)
            if not data:
                return True  # the member closed the stream: look again
            seen = (seen + data)[-_WATCH_BYTES_MAX:]
            # Keys and values travel in base64, so these markers cannot come from user data.
            if b'"type":"DELETE"' in seen or b'"canceled":true' in seen or b'"error"' in seen:
                return True
    except OSError:
        return True
    finally:
        stream.close()
