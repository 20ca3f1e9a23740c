"""The checks of the sharded key-value example, over the shard logs, the histories and the nodes' states.

- acknowledged appends lost: an ``ok`` (or replayed) append whose offset does not hold its value;
- duplicated: a value (each put's idempotency key) at more than one offset;
- gaps: offsets of a shard that are not 0, 1, 2, ...;
- out of order: entries a storage node saw at an offset other than its next one;
- stale accepted: an entry whose token is below a token of an earlier entry of its shard;
- the storage nodes' digests, and each one against the state the logs replay to;
- each shard's history (writers' appends, nodes' reads) checked for
  linearizability against the fenced register (`stockade.testing.linearizability`).
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from router import shard_name

from stockade.resources.log import LogEntry, open_postgres_log
from stockade.testing.linearizability import check_linearizable

PAGE = 1_000


def read_logs(url: str, shards: int) -> dict[str, list[LogEntry]]:
    with open_postgres_log(url, keys="unsigned", install=False) as log:
        logs: dict[str, list[LogEntry]] = {}
        for shard in (shard_name(i) for i in range(shards)):
            entries: list[LogEntry] = []
            while True:
                page = log.read(shard, len(entries), PAGE)
                entries += page
                if len(page) < PAGE:
                    break
            logs[shard] = entries
        return logs


def check(url: str, shards: int, records: list[dict[str, Any]], nodes: list[dict[str, Any]]) -> dict[str, Any]:
    logs = read_logs(url, shards)
    at: dict[tuple[str, int], str] = {}
    seen: Counter[str] = Counter()
    gaps = stale_accepted = 0
    replayed_state: dict[str, dict[str, str]] = {}
    for shard, entries in logs.items():
        highest = 0
        state: dict[str, str] = {}
        for index, entry in enumerate(entries):
            gaps += entry.offset != index
            stale_accepted += entry.token_value < highest
            highest = max(highest, entry.token_value)
            operation = json.loads(entry.data)
            at[(shard, entry.offset)] = operation["v"]
            seen[operation["v"]] += 1
            state[operation["k"]] = operation["v"]
        replayed_state[shard] = state
    writes = [r for r in records if r.get("f") == "write" and r["type"] != "invoke"]
    acked = [r for r in writes if "offset" in r]
    lost = sum(at.get((r["scope"], r["offset"])) != r["value"] for r in acked)
    refused = sum(r["type"] == "fail" and r.get("error") == "stale-token" for r in writes)
    verdict = check_linearizable(sorted(records, key=lambda r: r["t_ns"]))
    digests = sorted({n["digest"] for n in nodes})
    return {
        "entries": sum(len(e) for e in logs.values()),
        "acknowledged": len(acked),
        "acknowledged_lost": lost,
        "duplicated": sum(n - 1 for n in seen.values() if n > 1),
        "gaps": gaps,
        "out_of_order": sum(n["out_of_order"] for n in nodes),
        "stale_accepted": stale_accepted,
        "stale_refused": refused,
        "nodes": len(nodes),
        "node_digests": len(digests),
        "nodes_match_logs": sum(n["state"] == replayed_state for n in nodes),
        "reads": sum(r.get("f") == "read" and r["type"] == "ok" for r in records),
        "linearizable": verdict.ok,
        "linearizability_violations": [str(v) for v in verdict.violations][:5],
        "linearizability_undecided": verdict.undecided,
    }
