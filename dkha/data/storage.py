"""Object storage: the fsspec settings dkha uses for store URLs (``s3://…``, ``gs://…``).

``--storage-option KEY=VALUE`` settings are kept here per process and merged into fsspec's
configuration for the protocol of each URL opened; the row engine copies them to the workers
(:func:`dkha.engine.cluster.share_storage_options`).
"""

from __future__ import annotations

import json

import fsspec
import fsspec.config

from dkha.errors import InputError, ParameterError


def is_url(path: str) -> bool:
    """Whether ``path`` is an fsspec URL (``protocol://…``) rather than a local path."""
    return "://" in str(path)


#: ``--storage-option KEY=VALUE`` settings, applied to the protocol of every store URL dkha opens
_STORAGE_OPTIONS: dict = {}


def parse_storage_option(text: str) -> tuple[str, object]:
    """``KEY=VALUE`` → ``(KEY, VALUE)``, the value read as JSON where it is JSON (``true``,
    ``3``, ``{"region_name": "eu"}``) and as a string otherwise."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ParameterError(f"a storage option is KEY=VALUE (e.g. endpoint_url=http://host:9000), "
                             f"got {text!r}")
    try:
        return key.strip(), json.loads(value)
    except ValueError:
        return key.strip(), value


def set_storage_options(options: dict) -> None:
    """Settings of the file systems of store URLs (fsspec keyword arguments, e.g. s3fs's
    ``endpoint_url``, ``key``, ``secret``, ``anon``), added to what the environment gives
    (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``FSSPEC_S3_*`` …). They take effect for the
    protocol of each URL opened afterwards, in this process and, through the row engine, on the
    workers (:func:`dkha.engine.cluster.share_storage_options`)."""
    _STORAGE_OPTIONS.update(options)


def url_protocol(path: str) -> str | None:
    """``"s3"`` for ``s3://bucket/x.zarr``; ``None`` for a local path."""
    return str(path).split("://", 1)[0] if is_url(path) else None


def storage_settings(path: str) -> dict:
    """The fsspec settings this process uses for ``path``'s protocol (empty for local paths);
    ``--storage-option`` settings are merged into fsspec's configuration on first use."""
    protocol = url_protocol(path)
    if protocol is None:
        return {}
    if _STORAGE_OPTIONS:
        fsspec.config.conf.setdefault(protocol, {}).update(_STORAGE_OPTIONS)
    return dict(fsspec.config.conf.get(protocol, {}))


def apply_storage_settings(protocol: str, settings: dict) -> None:
    """Make ``settings`` this process's fsspec defaults for ``protocol`` (run on workers)."""
    fsspec.config.conf.setdefault(protocol, {}).update(settings)


def url_fs(path: str):
    """``(file system, root)`` of a store URL, or a one-line error naming the missing package."""
    try:
        return fsspec.core.url_to_fs(path)
    except (ImportError, ValueError) as exc:
        raise ParameterError(f"cannot open {path}: {exc} (object stores need their fsspec "
                             "package, e.g. s3fs for s3://)") from None


def reach(path: str, name: str = "") -> tuple:
    """``(file system, root, whether root/name exists)`` of the store URL ``path``, its
    settings applied (:func:`storage_settings`), or a one-line error where it cannot be
    reached."""
    storage_settings(path)
    fs, root = url_fs(path)
    try:
        return fs, root, fs.exists(f"{root.rstrip('/')}/{name}" if name else root)
    except Exception as exc:  # noqa: BLE001 - botocore/aiohttp raise many kinds
        raise InputError(f"cannot reach the data store {path}: {type(exc).__name__}: {exc} "
                         "(check the endpoint and credentials: AWS_ENDPOINT_URL, "
                         "AWS_ACCESS_KEY_ID, … or --storage-option KEY=VALUE)") from None
