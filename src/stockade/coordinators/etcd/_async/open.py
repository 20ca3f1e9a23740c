"""Opening an etcd cluster by url: the ``etcd`` entry of `stockade.coordinators.registry`."""

from __future__ import annotations

from stockade.client._shared import CONNECT_TIMEOUT_MS_DEFAULT, TIMEOUT_MS_DEFAULT, TIMEOUT_MS_MAX
from stockade.coordinators import etcd as recipe
from stockade.coordinators.etcd._async.port import AsyncEtcdCoordinatorPort
from stockade.coordinators.registry import PortOptions
from stockade.core.errors import InvalidArgument
from stockade.core.leases import LeasePolicy
from stockade.core.limits import validate_int
from stockade.keys import FixedKeys
from stockade.transport.io import AsyncIO

__all__ = ["open_port"]


def open_port(options: PortOptions) -> AsyncEtcdCoordinatorPort:
    """The ``etcd://`` entry of `stockade.coordinators.registry`; outside a running loop its cluster id and
    keyring are read here.

    Raises:
        InvalidArgument: a bad location, ``auth_token`` or ``tls_ca`` given, a bad timeout or lock delay.
        BackendUnavailable: the cluster cannot be reached (outside a running loop).
    """
    if options.auth_token is not None or options.tls_ca is not None:
        raise InvalidArgument("url", "etcd:// speaks plain HTTP without auth in this version")
    members, layout = recipe.parse_location(options.location)
    timeout_ms = validate_int(
        "timeout_ms", TIMEOUT_MS_DEFAULT if options.timeout_ms is None else options.timeout_ms, 1, TIMEOUT_MS_MAX)
    connect_timeout_ms = validate_int(
        "connect_timeout_ms",
        CONNECT_TIMEOUT_MS_DEFAULT if options.connect_timeout_ms is None else options.connect_timeout_ms,
        1, TIMEOUT_MS_MAX)
    capabilities = options.capabilities
    lock_delay_ms = LeasePolicy(lock_delay_ms=options.lock_delay_ms).lock_delay_ms  # validated before any I/O
    identity = None
    if not AsyncIO.loop_running():  # one blocking read now, as for a remote server's cluster id

        async def read() -> tuple[str, FixedKeys]:
            reader = AsyncEtcdCoordinatorPort(
                members, layout, timeout_ms=timeout_ms, connect_timeout_ms=connect_timeout_ms,
                capabilities=capabilities,
            )
            try:
                await reader.open()
                return reader.identity()
            finally:
                await reader.aclose()

        identity = AsyncIO.run_now(read)
    return AsyncEtcdCoordinatorPort(
        members, layout, timeout_ms=timeout_ms, connect_timeout_ms=connect_timeout_ms, capabilities=capabilities,
        identity=identity, lock_delay_ms=lock_delay_ms,
    )
