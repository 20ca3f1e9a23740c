"""The transport's I/O written once as async code; its sync twin in _sync/ is generated from it."""
