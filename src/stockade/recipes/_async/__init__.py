"""The recipes written once as async code; their sync twins in _sync/ are generated from them."""
