"""Transport: the I/O below the backends. The one hand-written sync/async pair (`io`), the timer
thread, HTTP/1.1 framing (`http11`), PostgreSQL connections and error text (`postgres`)."""
