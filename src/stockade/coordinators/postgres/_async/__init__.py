"""The postgres port, written once as async code; the sync port in _sync/ is generated from it."""
