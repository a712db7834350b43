"""The installed version of dkha (recorded in every run's attrs)."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("dkha")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0.0.0+unknown"
