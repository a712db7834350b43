"""A fit over TLS with distributed's Security settings; a plain client is refused.

The test makes a temporary certificate authority and certificate, starts ``dask scheduler`` and
``dask worker`` with ``--tls-*`` options on 127.0.0.1, and runs ``dkha fit`` with the TLS client
settings given as Dask configuration through the environment (how users configure it too). The
embedded run it is compared with and the plain clients that are refused run the command in this
process (:func:`tests.processes.dkha_in_process`), which has no TLS settings.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import subprocess
import sys

import numpy as np
import pytest
import xarray as xr

from dkha.data.ingest import ingest_array
from tests.processes import dkha_in_process, start_dask_cluster, stop_processes, subprocess_env

cryptography = pytest.importorskip("cryptography")

pytestmark = pytest.mark.cluster


def make_certificates(d: str) -> tuple[str, str, str]:
    """A CA and one certificate (for 127.0.0.1/localhost) signed by it; returns (ca, cert, key)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "dkha test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(days=1))
          .not_valid_after(now + datetime.timedelta(days=2))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.SubjectAlternativeName([
                x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = [os.path.join(d, n) for n in ("ca.pem", "cert.pem", "key.pem")]
    with open(paths[0], "wb") as f:
        f.write(ca.public_bytes(serialization.Encoding.PEM))
    with open(paths[1], "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))
    with open(paths[2], "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))
    return tuple(paths)


def _env(tls: tuple[str, str, str] | None = None):
    extra = {"DASK_DKHA__CONNECT_TIMEOUT": "5s"}
    if tls:
        ca, cert, key = tls
        extra.update({"DASK_DISTRIBUTED__COMM__TLS__CA_FILE": ca,
                      "DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT": cert,
                      "DASK_DISTRIBUTED__COMM__TLS__CLIENT__KEY": key,
                      "DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION": "True"})
    return subprocess_env(**extra)


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory):
    from distributed.security import Security

    d = str(tmp_path_factory.mktemp("tls"))
    ca, cert, key = make_certificates(d)
    opts = ["--tls-ca-file", ca, "--tls-cert", cert, "--tls-key", key]
    sec = Security(tls_ca_file=ca, tls_client_cert=cert, tls_client_key=key,
                   require_encryption=True)
    address, _, scheduler, workers = start_dask_cluster(
        d, 1, nthreads=2, scheduler_args=["--protocol", "tls", *opts], worker_args=opts,
        security=sec)
    try:
        yield address, (ca, cert, key)
    finally:
        stop_processes([scheduler, *workers])


FIT = ["--algorithm", "kha-et", "--components", "4", "--sigma", "4", "--passes", "2",
       "--evaluate-every", "0", "--quiet"]


def _fit(store, out, *extra, env):
    """``dkha fit`` as a process of its own, its TLS settings from the environment ``env``."""
    return subprocess.run([sys.executable, "-m", "dkha.cli", "fit", store, "-o", out, *FIT,
                           *extra], env=env, capture_output=True, text=True, timeout=300,
                          check=False)


def _fit_here(store, out, *extra):
    """``dkha fit`` in this process: no TLS settings (this process has none), a 5 s connect
    timeout as :func:`_env` gives."""
    return dkha_in_process("fit", store, "-o", out, *FIT, *extra,
                           config={"dkha.connect-timeout": "5s"})


def test_fit_over_tls_equals_the_embedded_run_and_plain_clients_are_refused(tls_cluster, tmp_path):
    from sklearn.datasets import load_digits

    address, tls = tls_cluster
    assert address.startswith("tls://127.0.0.1:")
    store = str(tmp_path / "d.zarr")
    ingest_array(load_digits().data[:400] / 8.0 - 1.0, store, chunk_rows=100)
    p = _fit(store, str(tmp_path / "tls"), "--scheduler", address, env=_env(tls))
    assert p.returncode == 0, p.stderr
    p = _fit_here(store, str(tmp_path / "local"))      # the embedded run
    assert p.returncode == 0, p.stderr
    a = xr.open_zarr(str(tmp_path / "tls" / "components.zarr"))["alpha"].values
    b = xr.open_zarr(str(tmp_path / "local" / "components.zarr"))["alpha"].values
    assert np.max(np.abs(a - b)) <= 1e-10 * np.max(np.abs(b))
    # a client without the certificates cannot attach
    plain = _fit_here(store, str(tmp_path / "plain"), "--scheduler", address)
    assert plain.returncode != 0
    assert "Traceback" not in plain.stderr and plain.stderr.startswith("dkha: error:")
    assert not os.path.exists(tmp_path / "plain" / "components.zarr")
    tcp = _fit_here(store, str(tmp_path / "tcp"), "--scheduler",
                    address.replace("tls://", "tcp://"))
    assert tcp.returncode != 0 and "Traceback" not in tcp.stderr
