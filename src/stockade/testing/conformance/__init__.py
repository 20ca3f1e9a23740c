"""Conformance suites: one per port, run against every registered scheme.

- `stockade.testing.conformance.store`: the fenced-store port
  (`stockade.resources.port.TransactionalStorePort`), rules R1, R2, R3, R5,
  R6 and bad input.
- `stockade.testing.conformance.coordinator`: the coordinator port, the
  coordinator rules C1-C5 and the client's lease objects, sync and async;
  written in parts by rule (`coordinator_grants`, `coordinator_waits`,
  `coordinator_expiry`, `coordinator_inspect`, sharing `coordinator_helpers`),
  which that module gathers.
- `stockade.testing.conformance.fence`: the adapters that keep the mark inside
  a user's own data (PostgreSQL, SQLite, Redis, files): R1, R2 with forged
  tokens, R4 floors, R5, R6, S05, S19, S20 and bad input.
- `stockade.testing.conformance.fence_partial`: the same adapters, a unit whose
  later write fails (refused by the resource, or a fault injected after the
  first write): nothing of it applied, no mark moved; an optional capability
  each adapter declares, with the reason where a kind does not apply.
- `stockade.testing.conformance.fence_retry`: the same adapters' retry class,
  a retry after an unknown outcome (R3 by operation id), on every adapter that
  offers operation ids; the others declare in words why they do not.
- `stockade.testing.conformance.fence_paused`: the same adapters, a writer
  paused for real (SIGSTOP) inside its unit while a newer token writes: the
  newer one completes within the adapter's declared bound and the resumed
  writer is refused whole (L1); each adapter states its bound, or in words why
  it has none, and a stall declared is shown to be real (the newer one still
  waiting, the resumed writer committing first, R6).
- `stockade.testing.conformance.fence_target`: one descriptor per fence
  adapter (its harness opener, each optional capability above or why it
  lacks it), named by `stockade.resources.registry.FENCE_TARGETS`.
- `stockade.testing.conformance.journal`: every coordinator's lease journal
  (grants, expiries, releases, as ``history()`` answers them), in order and
  bounded, run beside the coordinator suite with its fixtures. (Not the
  checker's operation histories of `stockade.testing.history`.)

A new backend or adapter is accepted when it passes its port's suite; the
project's tests refuse a registered scheme that has no parameter in them.
"""

from stockade import metrics


def rejections_counted(reason: str) -> float:
    """The sum of every R5 series with this reason, whatever other labels the metric has."""
    total = 0.0
    for line in metrics.REGISTRY.render().splitlines():
        if line.startswith("stockade_fence_rejections_total") and f'reason="{reason}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total
