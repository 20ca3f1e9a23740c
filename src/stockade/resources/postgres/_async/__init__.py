"""The PostgreSQL fence's fronts, written once as async code; the sync ones in _sync/ are generated from them."""
