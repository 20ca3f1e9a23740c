"""stockade.testing: the proof kit — broken controls, simulators, fault injection, history checkers.

- `mutants`: deliberately broken fenced stores. Every fault test runs once
  against one of them and must fail there: a test that cannot fail proves nothing.

Nothing in the package imports `stockade.testing`; it may import anything.
"""
