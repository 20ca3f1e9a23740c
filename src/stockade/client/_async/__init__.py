"""The async client: the one source the sync client is generated from."""
