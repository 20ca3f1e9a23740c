"""Conformance suites: one per port, run against every registered scheme.

- `stockade.testing.conformance.store`: the fenced-store port
  (`stockade.resources.port.TransactionalStorePort`), rules R1, R2, R3, R5,
  R6 and bad input.
- `stockade.testing.conformance.coordinator`: the coordinator port, the
  coordinator rules C1-C5 and the client's lease objects, sync and async.

A new backend or adapter is accepted when it passes its port's suite; the
project's tests refuse a registered scheme that has no parameter in them.
"""
