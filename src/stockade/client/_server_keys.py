"""A remote `stockade serve`'s verify keys, for a resource beside it (docs/tokens.md).

``coord.verify_keys()`` on an ``http(s)://`` coordinator fetches the server's
keyring from its administrators' route (``GET /v1/admin/verify-keys``) in one
blocking round trip, and returns it as `stockade.keys.FixedKeys`. The keys can
mint tokens as well as verify them, so the server hands them only to a bearer
token without scope patterns (``connect(url, auth_token=...)``), on a server
started with ``--auth-tokens``; anyone else gets `Unauthorized`.

The keys are a copy: after ``stockade keys rotate`` on the server's host, call
``verify_keys()`` again (a token of the new key is refused as ``unknown-key``
until then), or keep the keyring in a file (``stockade keys export``) that a
`stockade.keys.KeyFile` follows.
"""

from __future__ import annotations

from pathlib import Path

from stockade.client._shared import HTTPEndpoint
from stockade.keys import FixedKeys, _parse
from stockade.wire import codecs
from stockade.wire.routes import ROUTE

__all__ = ["fetch_verify_keys"]


def fetch_verify_keys(endpoint: HTTPEndpoint) -> FixedKeys:
    """The server's keyring (one blocking round trip).

    Raises:
        Unauthorized: no administrator's token, or a server without auth.
        BackendUnavailable: the server cannot be reached, or the answer is not a keyring.
    """
    from stockade.client._sync._http import HTTPClient  # the blocking twin: this is called outside any loop

    client = HTTPClient(endpoint)
    try:
        _, doc = client.get_json(ROUTE["verifyKeys"].target())
    finally:
        client.close()
    keyring = _parse(codecs.dumps(doc), Path(f"{endpoint.authority}{ROUTE['verifyKeys'].path}"))  # for its message
    return FixedKeys(keyring)
