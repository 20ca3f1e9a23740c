"""The HTTP remote: a `stockade serve` spoken to over HTTP/1.1 (``http://``, ``https://``)."""
