"""Outbound TLS trusts what the system trusts, and what SSL_CERT_FILE names instead.

Every outbound call verifies the downstream's certificate against the system's CA store,
as OpenSSL finds it, or against the bundle an operator names in SSL_CERT_FILE
(docs/operations.md, "Audits of https pages fail with a certificate error"). A downstream
here serves https on 127.0.0.1 with a certificate from a CA made for the test.
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl

import httpx2
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from outbound import client as outbound_client
from outbound.client import build_client
from tests.http_server import LocalServer


def _certificate(subject: str, key, issuer: x509.Name | None, issuer_key, *, ca: bool):
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer or name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if not ca:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
    return builder.sign(issuer_key, hashes.SHA256())


@pytest.fixture(scope="module")
def authority(tmp_path_factory):
    """A CA's bundle and a certificate it signed for 127.0.0.1, as PEM files."""
    folder = tmp_path_factory.mktemp("tls")
    ca_key, leaf_key = (
        ec.generate_private_key(ec.SECP256R1()),
        ec.generate_private_key(ec.SECP256R1()),
    )
    ca = _certificate("Plumb test CA", ca_key, None, ca_key, ca=True)
    leaf = _certificate("127.0.0.1", leaf_key, ca.subject, ca_key, ca=False)
    (folder / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (folder / "leaf.pem").write_bytes(
        leaf.public_bytes(serialization.Encoding.PEM)
        + leaf_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return folder


@pytest.fixture
def https_site(authority, http_server):
    server = LocalServer(respond=lambda request: (200, {}, b"<html><title>t</title></html>"))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(authority / "leaf.pem")
    server.socket = context.wrap_socket(server.socket, server_side=True)
    http_server(server)
    return f"https://127.0.0.1:{server.server_address[1]}/"


@pytest.fixture
def fresh_tls_context(monkeypatch):
    """The process's TLS context is made once; each test makes its own from its environment."""
    monkeypatch.setattr(outbound_client, "_tls", None)
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    return monkeypatch


def test_a_certificate_from_an_authority_the_system_does_not_trust_is_refused(
    https_site, fresh_tls_context
):
    with pytest.raises(httpx2.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        build_client(timeout=5, allow_private=True).get(https_site)


def test_ssl_cert_file_names_the_authorities_outbound_calls_trust(
    https_site, authority, fresh_tls_context
):
    fresh_tls_context.setenv("SSL_CERT_FILE", str(authority / "ca.pem"))
    response = build_client(timeout=5, allow_private=True).get(https_site)
    assert response.status_code == 200
    assert b"<title>t</title>" in response.read()
