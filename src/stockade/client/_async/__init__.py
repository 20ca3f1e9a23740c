"""The client, written once as async code; the sync client in _sync/ is generated from it."""
