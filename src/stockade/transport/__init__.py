"""Transport: the I/O below the backends, and its hand-written sync/async pairs.

- `io`: how to sleep, wait, spawn, schedule, block and open a TCP stream, as ``AsyncIO`` and ``SyncIO``.
- `timer`: the one timer thread of the sync side.
- `kazoo`: waiting for kazoo's answers (the ZooKeeper port), as ``AsyncZkBridge`` and ``ZkBridge``.
- `http11`: HTTP/1.1 framing of requests and responses (the HTTP remote, etcd's gateway).
- `postgres`: opening a PostgreSQL connection, and its errors as text.
- `sqlite_url`: the file a ``sqlite://`` url names (SQLAlchemy's convention: three slashes relative, four absolute).
"""
