"""The Redis fence, written once as async code; the sync fence in _sync/ is generated from it."""
