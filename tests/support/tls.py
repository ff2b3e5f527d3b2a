"""A throw-away certificate authority for HTTPS tests: a CA and a server certificate for 127.0.0.1 it signed."""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class ServerCertificates:
    ca: str  # PEM of the CA certificate: the bundle clients trust
    server: str  # PEM of the server certificate, valid for 127.0.0.1 and localhost
    server_key: str  # PEM of its private key (PKCS#8, unencrypted)


def _name(text: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, text)])


def _builder(subject: x509.Name, issuer: x509.Name, public_key) -> x509.CertificateBuilder:
    now = dt.datetime.now(dt.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
    )


def make_ca_and_server_cert(folder: Path) -> ServerCertificates:
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_usage = x509.KeyUsage(
        digital_signature=True,
        key_cert_sign=True,
        crl_sign=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        encipher_only=False,
        decipher_only=False,
    )
    ca_cert = (
        _builder(_name("dgx-assets test CA"), _name("dgx-assets test CA"), ca_key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(ca_usage, critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    server_key = ec.generate_private_key(ec.SECP256R1())
    addresses = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
    server_cert = (
        _builder(_name("127.0.0.1"), ca_cert.subject, server_key.public_key())
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(addresses), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    paths = ServerCertificates(str(folder / "ca.pem"), str(folder / "server.pem"), str(folder / "server.key"))
    Path(paths.ca).write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    Path(paths.server).write_bytes(server_cert.public_bytes(serialization.Encoding.PEM))
    key_pem = server_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    Path(paths.server_key).write_bytes(key_pem)
    return paths
