"""TLS (`tls://`, `wss://`, mutual TLS), WebSocket (`ws://`) and shared-memory (`shm://`)
transports: a Python client against a Python server, with certificates generated at test time
(`cryptography`)."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import os
import tempfile
from typing import Iterator, NamedTuple, Optional

import kv_server
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from kv.v1 import kv_pb2, kv_topspin

import topspin


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write(path: str, data: bytes) -> str:
    with open(path, "wb") as f:
        f.write(data)
    return path


def _pem_key(k: ec.EllipticCurvePrivateKey) -> bytes:
    return k.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


class Ca:
    """A certificate authority that signs leaf certificates into PEM files."""

    def __init__(self, d: str, name: str) -> None:
        self.dir = d
        self.name = name
        self.key = _key()
        now = datetime.datetime.now(datetime.timezone.utc)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(_name(name))
            .issuer_name(_name(name))
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
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
            .sign(self.key, hashes.SHA256())
        )
        self.pem = _write(
            os.path.join(d, f"{name}.pem"), self.cert.public_bytes(serialization.Encoding.PEM)
        )

    def leaf(self, cn: str, *, server: bool) -> tuple[str, str]:
        """(cert_pem, key_pem) paths of a leaf for `localhost`/127.0.0.1 (server) or a client."""
        key = _key()
        now = datetime.datetime.now(datetime.timezone.utc)
        b = (
            x509.CertificateBuilder()
            .subject_name(_name(cn))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        )
        if server:
            b = b.add_extension(
                x509.SubjectAlternativeName(
                    [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
                ),
                critical=False,
            ).add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
            )
        else:
            b = b.add_extension(
                x509.SubjectAlternativeName([x509.DNSName(cn)]), critical=False
            ).add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
            )
        cert = b.sign(self.key, hashes.SHA256())
        c = _write(
            os.path.join(self.dir, f"{cn}.crt"), cert.public_bytes(serialization.Encoding.PEM)
        )
        k = _write(os.path.join(self.dir, f"{cn}.key"), _pem_key(key))
        return c, k


class Pki(NamedTuple):
    ca: str
    other_ca: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str


@pytest.fixture(scope="module")
def pki() -> Iterator[Pki]:
    with tempfile.TemporaryDirectory() as d:
        ca = Ca(d, "test-ca")
        other = Ca(d, "other-ca")
        sc, sk = ca.leaf("server", server=True)
        cc, ck = ca.leaf("client", server=False)
        yield Pki(ca.pem, other.pem, sc, sk, cc, ck)


def serve(address: str, tls: Optional[topspin.ServerTls] = None) -> tuple[topspin.Server, str]:
    server = topspin.Server(tls=tls)
    kv_topspin.add_StoreServicer_to_server(kv_server.SyncStore(kv_server.Store()), server)
    return server, server.start(address)


def round_trip(channel: topspin.Channel) -> None:
    store = kv_topspin.StoreClient(channel)
    store.Put(kv_pb2.PutRequest(key="k", value="v"), timeout=10)
    assert store.Get(kv_pb2.GetRequest(key="k"), timeout=10).value == "v"
    watch = store.Watch(kv_pb2.WatchRequest(prefix="k"), timeout=10)
    first = next(iter(watch))
    assert first.put.value == "v"
    watch.cancel()


def test_tls_handshake_ok_blocking_and_asyncio(pki: Pki) -> None:
    server, bound = serve("tls://127.0.0.1:0", topspin.ServerTls(pki.server_cert, pki.server_key))
    try:
        assert bound.startswith("tls://127.0.0.1:")
        # The certificate names 127.0.0.1 and localhost: by address, and with a server name.
        round_trip(topspin.Channel(bound, ca_pem=pki.ca))
        round_trip(topspin.Channel(bound, ca_pem=pki.ca, server_name="localhost"))

        async def main() -> None:
            client = kv_topspin.StoreAsyncClient(topspin.AsyncChannel(bound, ca_pem=pki.ca))
            got = await asyncio.gather(
                *(client.Get(kv_pb2.GetRequest(key="k"), timeout=10) for _ in range(8))
            )
            assert [e.value for e in got] == ["v"] * 8

        asyncio.run(main())
    finally:
        server.stop(1)


def test_tls_wrong_ca_fails_unavailable_naming_tls(pki: Pki) -> None:
    server, bound = serve("tls://127.0.0.1:0", topspin.ServerTls(pki.server_cert, pki.server_key))
    try:
        store = kv_topspin.StoreClient(topspin.Channel(bound, ca_pem=pki.other_ca))
        with pytest.raises(topspin.StatusError) as e:
            store.Get(kv_pb2.GetRequest(key="k"), timeout=10)
        assert e.value.code == topspin.Code.UNAVAILABLE
        assert "TLS" in e.value.message, e.value.message
        # A name the certificate does not carry fails the same way.
        store = kv_topspin.StoreClient(
            topspin.Channel(bound, ca_pem=pki.ca, server_name="elsewhere.example")
        )
        with pytest.raises(topspin.StatusError) as e:
            store.Get(kv_pb2.GetRequest(key="k"), timeout=10)
        assert e.value.code == topspin.Code.UNAVAILABLE
        assert "TLS" in e.value.message, e.value.message
    finally:
        server.stop(1)


def test_mutual_tls(pki: Pki) -> None:
    tls = topspin.ServerTls(pki.server_cert, pki.server_key, client_ca_pem=pki.ca)
    server, bound = serve("tls://127.0.0.1:0", tls)
    try:
        ok = topspin.Channel(bound, ca_pem=pki.ca, cert_pem=pki.client_cert, key_pem=pki.client_key)
        round_trip(ok)
        anonymous = kv_topspin.StoreClient(topspin.Channel(bound, ca_pem=pki.ca))
        with pytest.raises(topspin.StatusError) as e:
            anonymous.Get(kv_pb2.GetRequest(key="k"), timeout=10)
        assert e.value.code == topspin.Code.UNAVAILABLE, e.value
    finally:
        server.stop(1)


def test_wss(pki: Pki) -> None:
    server, bound = serve(
        "wss://127.0.0.1:0/kv", topspin.ServerTls(pki.server_cert, pki.server_key)
    )
    try:
        assert bound.startswith("wss://127.0.0.1:"), bound
        round_trip(topspin.Channel(bound, ca_pem=pki.ca))
    finally:
        server.stop(1)


@pytest.mark.parametrize("address", ["ws://127.0.0.1:0/kv", f"shm://topspin-py-test-{os.getpid()}"])
def test_ws_and_shm_blocking_and_asyncio(address: str) -> None:
    server, bound = serve(address)
    try:
        if address.startswith("ws://"):
            assert bound.startswith("ws://127.0.0.1:"), bound
        else:
            assert bound == address, bound
        round_trip(topspin.Channel(bound))

        async def main() -> None:
            client = kv_topspin.StoreAsyncClient(topspin.AsyncChannel(bound))
            assert (await client.Get(kv_pb2.GetRequest(key="k"), timeout=10)).value == "v"

        asyncio.run(main())
    finally:
        server.stop(1)


def test_bad_tls_settings_are_value_errors(pki: Pki) -> None:
    with pytest.raises(ValueError, match="cert_pem and key_pem"):
        topspin.Channel("tls://127.0.0.1:1", cert_pem=pki.client_cert)
    with pytest.raises(ValueError):
        topspin.Channel("tls://127.0.0.1:1", ca_pem=os.path.join(os.path.dirname(pki.ca), "nope"))
    with pytest.raises(ValueError):
        topspin.Server(tls=topspin.ServerTls(pki.server_cert, pki.ca)).start("tls://127.0.0.1:0")
