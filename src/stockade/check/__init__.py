"""``stockade check``: the failure cases of fencing, run against the user's own coordinator and resource.

- `targets` (and `_targets_net`): each kind of resource (stockade's store, a
  SQLite database, a directory, PostgreSQL, Redis) behind one small seam: write
  under a token, read back, its setup lines, its scratch prefix.
- `worker`: the worker process; it takes one command a line and answers one
  JSON event a line, so the orchestrator can freeze it between two.
- `cases`: the orchestrator's cases (the long pause, the delayed request, retries) and their verdicts.
- `_restarts`: the cases that take a server down (coordinator failover, resource
  restore), and the user's restart and restore commands, run bounded.

The timeline they produce is drawn by `stockade.timeline`. docs/check.md says
what each case does and what each setup line means.
"""

#: Every scope, table, key and subdirectory the check writes starts with this (then a random id).
SCRATCH_PREFIX = "stockade-check"

__all__ = ["SCRATCH_PREFIX"]
