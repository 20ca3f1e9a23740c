"""The PostgreSQL fence's transactions, written once as async code; _sync/ is generated from it."""
