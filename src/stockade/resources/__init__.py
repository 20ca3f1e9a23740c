"""Resources: what enforces tokens.

- `store`: stockade's own fenced key-value store on SQLite.
"""
