"""A TLS redis-server for the tests, with a CA and certificates made at run time.

`make_pki(dir)` writes ca.pem (the CA the server's certificate chains to), server.pem /
server-key.pem (for 127.0.0.1 and localhost) and other-ca.pem (a CA that signed nothing here: a
client trusting only it must refuse the server). Keys live in the temporary directory only.

`TLSRedisServer` is a `RedisServer` that also serves TLS on ``tls_port`` (its plain ``port`` stays
on loopback for the tests' own checks); ``tls_url`` is ``rediss://127.0.0.1:<tls_port>/0``.
"""
from __future__ import annotations

import datetime
import ipaddress
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tests._redis_server import RedisServer, free_port


@dataclass
class PKI:
    dir: Path
    ca: Path
    cert: Path
    key: Path
    other_ca: Path


def make_pki(directory: Path) -> PKI:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def ca(cn: str) -> tuple[object, x509.Certificate]:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (x509.CertificateBuilder().subject_name(name(cn)).issuer_name(name(cn))
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=2))
                .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                             data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                             crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
                .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
                .sign(key, hashes.SHA256()))
        return key, cert

    def pem(cert: x509.Certificate) -> bytes:
        return cert.public_bytes(serialization.Encoding.PEM)

    ca_key, ca_cert = ca("bullmq-compat test CA")
    _, other_cert = ca("bullmq-compat unrelated CA")
    server_key = ec.generate_private_key(ec.SECP256R1())
    server_cert = (
        x509.CertificateBuilder().subject_name(name("localhost")).issuer_name(ca_cert.subject)
        .public_key(server_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                    x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                       critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),  # type: ignore[arg-type]
                       critical=False)
        .sign(ca_key, hashes.SHA256()))  # type: ignore[arg-type]
    pki = PKI(directory, directory / "ca.pem", directory / "server.pem", directory / "server-key.pem",
              directory / "other-ca.pem")
    pki.ca.write_bytes(pem(ca_cert))
    pki.other_ca.write_bytes(pem(other_cert))
    pki.cert.write_bytes(pem(server_cert))
    pki.key.write_bytes(server_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                 serialization.NoEncryption()))
    os.chmod(pki.key, 0o600)
    return pki


class TLSRedisServer(RedisServer):
    """redis-server with ``--tls-port`` (certificates from `make_pki`), no client certificates asked."""

    def __init__(self, extra_args: tuple[str, ...] = ()) -> None:
        self.pki_dir = Path(tempfile.mkdtemp(prefix="bullmq-compat-tls-"))
        self.pki = make_pki(self.pki_dir)
        self.tls_port = free_port()
        super().__init__(extra_args=(
            "--tls-port", str(self.tls_port), "--tls-cert-file", str(self.pki.cert),
            "--tls-key-file", str(self.pki.key), "--tls-ca-cert-file", str(self.pki.ca),
            "--tls-auth-clients", "no", *extra_args))

    @property
    def tls_url(self) -> str:
        return f"rediss://127.0.0.1:{self.tls_port}/0"

    def stop(self) -> None:
        super().stop()
        shutil.rmtree(self.pki_dir, ignore_errors=True)
