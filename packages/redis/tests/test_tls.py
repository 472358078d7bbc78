"""``rediss://`` against a private TLS redis-server, with a throwaway CA made for the test.

The server listens on TLS only (``--port 0``); nothing here uses ``CHATKEEP_TEST_REDIS_URL``, so the tests
run once per nox run, in the standalone session.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
import os
import shutil
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import pytest
import pytest_asyncio
from redis.asyncio import Redis

from chatkeep.core import Message, SessionKey, StoreUnavailableError
from chatkeep.redis import RedisHistoryStore, open_store
from chatkeep.testing.faults import free_port

pytestmark = pytest.mark.skipif(
    os.environ.get("CHATKEEP_TEST_REDIS_URL", "").strip().startswith("redis+cluster://"),
    reason="runs in the standalone session",
)

KEY = SessionKey("tenant", "tls-session")


@dataclass(frozen=True)
class Certificates:
    ca: Path
    cert: Path
    key: Path


def make_certificates(directory: Path) -> Certificates:
    """A throwaway CA and a server certificate for 127.0.0.1 and localhost, valid for a day (EC P-256)."""
    x509 = pytest.importorskip("cryptography.x509")
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    before, after = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=1)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "chatkeep test CA")])
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(before)
        .not_valid_after(after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
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
        .add_extension(ca_ski, critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    server_key = ec.generate_private_key(ec.SECP256R1())
    server_cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_name)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(before)
        .not_valid_after(after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.IPv4Address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(server_key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    files = Certificates(ca=directory / "ca.pem", cert=directory / "server.pem", key=directory / "server.key")
    files.ca.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    files.cert.write_bytes(server_cert.public_bytes(serialization.Encoding.PEM))
    files.key.write_bytes(
        server_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return files


class TLSRedis:
    """A private redis-server listening on TLS only, on its own port (never the shared server)."""

    def __init__(self, port: int, certificates: Certificates, directory: Path) -> None:
        self.port = port
        self.certificates = certificates
        self.log = directory / "redis-server.log"
        self.process: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> str:
        """A ``rediss://`` URL that trusts the test CA."""
        return f"rediss://127.0.0.1:{self.port}/0?ssl_ca_certs={quote(str(self.certificates.ca), safe='/')}"

    async def start(self) -> None:
        if shutil.which("redis-server") is None:
            pytest.skip("redis-server is not installed; the TLS tests start a private one")
        certs = self.certificates
        with self.log.open("wb") as log:
            self.process = await asyncio.create_subprocess_exec(
                "redis-server", "--port", "0", "--tls-port", str(self.port), "--bind", "127.0.0.1",
                "--save", "", "--appendonly", "no", "--tls-cert-file", str(certs.cert),
                "--tls-key-file", str(certs.key), "--tls-ca-cert-file", str(certs.ca), "--tls-auth-clients", "no",
                stdout=log, stderr=log,
            )  # fmt: skip
        for _ in range(100):
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.process.wait(), 0.05)
            if self.process.returncode is not None:
                output = self.log.read_text(errors="replace")
                self.process = None
                if "FATAL CONFIG FILE ERROR" in output and "tls" in output.lower():
                    pytest.skip(f"this redis-server was built without TLS support ({' '.join(output.split())})")
                raise RuntimeError(f"the private TLS redis-server on port {self.port} exited:\n{output}")
            client = Redis(
                host="127.0.0.1", port=self.port, ssl=True, ssl_ca_certs=str(certs.ca), socket_connect_timeout=0.2
            )
            try:
                await client.ping()
                return
            except Exception:
                pass
            finally:
                await client.aclose()
        await self.stop()
        raise RuntimeError(f"the private TLS redis-server on port {self.port} did not answer")

    async def stop(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.kill()
            await self.process.wait()
        self.process = None


@pytest_asyncio.fixture(loop_scope="function")
async def tls_redis(tmp_path: Path) -> AsyncIterator[TLSRedis]:
    """A private TLS redis-server with a fresh CA, stopped at the end of the test."""
    server = TLSRedis(free_port(), make_certificates(tmp_path), tmp_path)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def test_rediss_round_trip_with_the_test_ca(tls_redis: TLSRedis) -> None:
    messages = [Message(role="user" if n % 2 == 0 else "assistant", text=f"tls-{n} ✓") for n in range(5)]
    raw = Redis(host="127.0.0.1", port=tls_redis.port, ssl=True, ssl_ca_certs=str(tls_redis.certificates.ca))
    try:
        async with open_store(tls_redis.url + "&prefix=tls") as store:
            assert isinstance(store, RedisHistoryStore)
            assert store.transport == "redis-py", "rediss:// must not use the plain-TCP resp transport"
            assert await store.append(KEY, messages[:3]) == 3
            assert await store.append(KEY, messages[2:]) == 2  # idempotent by message id
            assert await raw.exists("tls:tenants") == 1  # the data went to the TLS server, under the prefix
            loaded = await store.load(KEY)
            assert [m.text for m in loaded] == [m.text for m in messages]
            assert [m.message_id for m in loaded] == [m.message_id for m in messages]
            assert [m.text for m in await store.load(KEY, last=2)] == ["tls-3 ✓", "tls-4 ✓"]
            assert await store.count(KEY) == 5
            assert await store.delete(KEY) is True
            assert await store.count(KEY) == 0
            assert await store.load(KEY) == []
    finally:
        await raw.aclose()


async def fails_cleanly(call: Callable[[], Awaitable[object]], port: int) -> str:
    """``call`` raises StoreUnavailableError within a bounded time, naming the server, cause chained; its message."""
    started = time.monotonic()
    with pytest.raises(StoreUnavailableError) as caught:
        await call()
    assert time.monotonic() - started < 5, "a failed TLS connection did not fail within a bounded time"
    message = str(caught.value)
    assert f"127.0.0.1:{port}" in message
    assert caught.value.__cause__ is not None
    return message


@pytest.mark.reliability
async def test_rediss_without_the_ca_fails_certificate_verification(tls_redis: TLSRedis) -> None:
    # No ssl_ca_certs: the system CAs are used, and they do not know the test CA.
    async with open_store(f"rediss://127.0.0.1:{tls_redis.port}/0", socket_timeout=1, connect_timeout=1) as store:
        calls: list[Callable[[], Awaitable[object]]] = [
            lambda: store.append(KEY, [Message(role="user", text="x")]),
            lambda: store.count(KEY),
        ]
        for call in calls:
            message = await fails_cleanly(call, tls_redis.port)
            assert "certificate verify failed" in message
            assert "ssl_ca_certs" in message  # the hint says how to trust the server's CA


@pytest.mark.reliability
async def test_plain_redis_url_to_the_tls_port_fails_cleanly(tls_redis: TLSRedis, redis_transport: str) -> None:
    url = f"redis://127.0.0.1:{tls_redis.port}/0"
    async with open_store(url, socket_timeout=1, connect_timeout=1, transport=redis_transport) as store:
        calls: list[Callable[[], Awaitable[object]]] = [
            lambda: store.count(KEY),
            lambda: store.load(KEY, last=2),
            lambda: store.delete(KEY),
        ]
        for call in calls:
            await fails_cleanly(call, tls_redis.port)
