"""The realtime voice gateway: ``gateway.core`` (sans-I/O) and ``gateway.io`` (the shell)."""

from importlib import metadata


def version() -> str:
    """The installed distribution's version (the banner, ``/health``, ``--version``)."""
    try:
        return metadata.version("voice-gateway")
    except metadata.PackageNotFoundError:
        return "0+unknown"
