"""A tenant that tries to fill `stockade serve` with waiting acquires (issue 27, the server's tenants).

Usage: ``python tenant_flood.py HOST PORT --source ADDR --connections K --scope S [--token T]
[--seconds N] [--retry-ms M]``.

``K`` connections from source address ``ADDR`` each ask for scope ``S`` (held by
someone else) with a long ``wait_ms``, and ask again as soon as an answer comes
(a 409 at the deadline, a 429 share refusal after ``--retry-ms``); a connection
closed or reset by the server is opened again after ``--retry-ms``. It ignores
``Retry-After``: it takes everything it is given. Prints ``started`` once every
connection has been tried, and at the end one JSON line of counts by outcome.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json


async def worker(args: argparse.Namespace, counts: collections.Counter[str], tried: asyncio.Event,
                 remaining: list[int], stop: asyncio.Event) -> None:
    body = json.dumps({"ttl_ms": 1000, "wait_ms": 60_000, "holder": "flood"}).encode()
    auth = f"Authorization: Bearer {args.token}\r\n" if args.token else ""
    request = (f"POST /v1/locks/{args.scope}/acquire HTTP/1.1\r\nHost: x\r\n{auth}"
               f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body
    first = True
    while not stop.is_set():
        writer = None
        try:
            reader, writer = await asyncio.open_connection(args.host, args.port, local_addr=(args.source, 0))
            counts["connected"] += 1
            while not stop.is_set():
                writer.write(request)
                await writer.drain()
                if first:
                    first = False
                    remaining[0] -= 1
                    if remaining[0] == 0:
                        tried.set()
                status_line = await reader.readline()
                if not status_line:
                    counts["closed"] += 1
                    break
                status = status_line.split()[1].decode()
                length, close = 0, False
                while (line := await reader.readline()) not in (b"\r\n", b""):
                    name, _, value = line.decode("latin-1").partition(":")
                    if name.lower() == "content-length":
                        length = int(value)
                    elif name.lower() == "connection" and value.strip().lower() == "close":
                        close = True
                await reader.readexactly(length)
                counts[status] += 1
                if close:
                    break
                if status != "409":
                    await asyncio.sleep(args.retry_ms / 1000)
        except (OSError, asyncio.IncompleteReadError):
            counts["reset"] += 1
        finally:
            if writer is not None:
                writer.close()
        if first:
            first = False
            remaining[0] -= 1
            if remaining[0] == 0:
                tried.set()
        await asyncio.sleep(args.retry_ms / 1000)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("host")
    parser.add_argument("port", type=int)
    parser.add_argument("--source", default="127.0.0.1")
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--scope", default="held")
    parser.add_argument("--token", default=None)
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--retry-ms", type=int, default=50)
    args = parser.parse_args()
    counts: collections.Counter[str] = collections.Counter()
    tried, stop = asyncio.Event(), asyncio.Event()
    remaining = [args.connections]
    tasks = [asyncio.create_task(worker(args, counts, tried, remaining, stop)) for _ in range(args.connections)]
    await asyncio.wait_for(tried.wait(), args.seconds)
    print("started", flush=True)
    loop = asyncio.get_running_loop()
    done = asyncio.Event()
    loop.add_reader(0, done.set)  # the test closes our stdin (or the time is up) to stop us
    try:
        await asyncio.wait_for(done.wait(), args.seconds)
    except TimeoutError:
        pass
    stop.set()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    print(json.dumps(dict(counts)), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
