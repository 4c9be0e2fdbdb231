"""The local cluster's PKI: one CA, serving certificates, client certificates, the service-account key.

``ControlPlane`` (``rtj_localcluster.controlplane``) creates the CA and the API server's files once per
state directory (:func:`ensure_pki`, so that ``--keep-state`` keeps credentials valid) and a client
certificate per identity: the admin (group ``system:masters``, for kubectl, Helm and the tests), the
controller manager and scheduler (``system:kube-controller-manager``, ``system:kube-scheduler``), the
API server's client for kubelets, and one per simulated node (``system:node:<name>`` in
``system:nodes``, so that the Node authorizer and NodeRestriction admission judge what each kubelet
does). Identities are certificates because that is what the API server's ``--client-ca-file``
authenticates without any further set-up. Elliptic-curve keys keep generation fast on a loaded
machine.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# Names a client may use for the API server: the in-cluster service names of a real cluster too,
# so that a client configured like an in-cluster one still verifies the certificate.
SERVING_DNS_NAMES = (
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)
VALID_DAYS = 365


@dataclass(frozen=True)
class CertPair:
    """A certificate and its key, as PEM files."""

    cert: Path
    key: Path


@dataclass(frozen=True)
class Pki:
    """The files :func:`ensure_pki` keeps under one directory."""

    directory: Path
    ca: CertPair
    apiserver: CertPair
    service_account_key: Path
    """The key that signs service-account tokens (its public half: ``service_account_public``)."""
    service_account_public: Path

    def client(self, name: str, common_name: str, organizations: tuple[str, ...] = ()) -> CertPair:
        """A client certificate for ``common_name`` (the user) in ``organizations`` (its groups),
        issued once and reused."""
        pair = CertPair(self.directory / f"{name}.crt", self.directory / f"{name}.key")
        if not (pair.cert.exists() and pair.key.exists()):
            _issue(self.ca, pair, _name(common_name, organizations), client=True)
        return pair

    def serving(
        self, name: str, ip_addresses: tuple[str, ...] = ("127.0.0.1",), dns_names: tuple[str, ...] = ()
    ) -> CertPair:
        """A serving certificate for loopback and ``dns_names`` (the kubelets' HTTPS endpoints, the
        Metrics API's), issued once."""
        pair = CertPair(self.directory / f"{name}.crt", self.directory / f"{name}.key")
        if not (pair.cert.exists() and pair.key.exists()):
            names = ("localhost", *dns_names)
            _issue(self.ca, pair, _name(name), ip_addresses=ip_addresses, dns_names=names)
        return pair


def _name(common_name: str, organizations: tuple[str, ...] = ()) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in organizations]
    attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attributes)


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _validity() -> tuple[datetime.datetime, datetime.datetime]:
    now = datetime.datetime.now(datetime.UTC)
    # Backdated so that a clock a little behind on a client does not reject a brand-new certificate.
    return now - datetime.timedelta(hours=1), now + datetime.timedelta(days=VALID_DAYS)


def _make_ca(pair: CertPair) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    name = _name("rtj-local-ca")
    not_before, not_after = _validity()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(pair.key, key)


def _issue(
    ca: CertPair,
    pair: CertPair,
    subject: x509.Name,
    *,
    client: bool = False,
    ip_addresses: tuple[str, ...] = (),
    dns_names: tuple[str, ...] = (),
) -> None:
    ca_cert = x509.load_pem_x509_certificate(ca.cert.read_bytes())
    ca_key = serialization.load_pem_private_key(ca.key.read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    not_before, not_after = _validity()
    usage = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
    )
    alt_names: list[x509.GeneralName] = [x509.DNSName(name) for name in dns_names]
    alt_names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
    if alt_names:
        builder = builder.add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(pair.key, key)


def ensure_pki(directory: Path, service_ip: str) -> Pki:
    """The CA, the API server's serving certificate (loopback, ``service_ip`` and the in-cluster
    names) and the service-account signing key under ``directory``; created when missing."""
    directory.mkdir(parents=True, exist_ok=True)
    pki = Pki(
        directory=directory,
        ca=CertPair(directory / "ca.crt", directory / "ca.key"),
        apiserver=CertPair(directory / "apiserver.crt", directory / "apiserver.key"),
        service_account_key=directory / "service-account.key",
        service_account_public=directory / "service-account.pub",
    )
    if not (pki.ca.cert.exists() and pki.ca.key.exists()):
        _make_ca(pki.ca)
    if not pki.apiserver.cert.exists():
        _issue(
            pki.ca,
            pki.apiserver,
            _name("kube-apiserver"),
            ip_addresses=("127.0.0.1", service_ip),
            dns_names=SERVING_DNS_NAMES,
        )
    if not pki.service_account_key.exists():
        key = ec.generate_private_key(ec.SECP256R1())
        _write_key(pki.service_account_key, key)
        pki.service_account_public.write_bytes(
            key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
    return pki
