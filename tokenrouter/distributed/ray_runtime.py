"""The caller's connection to Ray: made by the first engine that needs it, shut down by the last.

`ray_address=None` uses the connection this process already has (`ray.init` by the caller),
else the cluster `ray start` runs on this machine, else fails with what to do. "local" starts a
Ray instance for this process, which the engine then stops when it closes. Any other address
("auto", "host:port", "ray://...") connects to that cluster. A connection an engine made is
closed when the last engine using it closes (`ray.shutdown()`: the driver disconnects; a
cluster it did not start keeps running); one the caller made is left alone.
"""

from __future__ import annotations

import importlib.util
import logging
import threading

from ..errors import ConfigError, EngineNotRunningError

log = logging.getLogger(__name__)

_lock = threading.Lock()
_users = 0  # engines using a connection that an engine made
_ours = False  # whether the current connection was made by an engine


def ray_installed() -> bool:
    return importlib.util.find_spec("ray") is not None


def import_ray():
    if not ray_installed():
        raise ConfigError("placement: running a model in a Ray actor needs Ray: pip install 'tokenrouter[ray]'")
    import ray

    return ray


def acquire(address: str | None):
    """Connect (or start) as `address` says; returns the `ray` module. Pair with `release()`."""
    global _users, _ours
    ray = import_ray()
    with _lock:
        if ray.is_initialized():
            if _ours:
                _users += 1
            elif address == "local":
                raise ConfigError(
                    "ray_address: 'local' starts a Ray instance, but this process is already connected to one"
                )
            return ray
        kwargs = {"logging_level": logging.WARNING, "configure_logging": False}
        try:
            if address == "local":
                ray.init(address="local", include_dashboard=False, **kwargs)
            else:
                ray.init(address=address or "auto", **kwargs)
        except ConnectionError as e:
            where = f"at {address!r}" if address else "on this machine (and none given: ray_address=None)"
            raise EngineNotRunningError(
                f"ray_address: no Ray cluster {where}: start one with `ray start --head`, pass its address, "
                f"or ray_address='local' to start one for this engine ({e})"
            ) from None
        _ours, _users = True, 1
        return ray


def release() -> None:
    """An engine is done with Ray: the last one out closes a connection that an engine made."""
    global _users, _ours
    with _lock:
        if not _ours:
            return
        _users -= 1
        if _users > 0:
            return
        _ours = False
        import ray

        if ray.is_initialized():
            ray.shutdown()
