"""TLS and SASL in front of the test broker.

tansu 0.6.0, the Kafka-protocol broker these machines have, takes neither: its SASL needs users
that only a storage engine the wheel's build leaves out can hold, and its listener does not
speak TLS. So the tests put this front on a loopback port and the broker behind it: it ends TLS
(with a server certificate and, when asked, a client certificate signed by the test CA), runs
the broker's side of SASL PLAIN and SCRAM-SHA-256/512 (KIP-43, RFC 5802) for the users it is
given, and then passes the connection's bytes through to the broker unchanged. The broker
advertises the front's address (``EmbeddedKafka(advertised=...)``), so every connection a
client makes goes through it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import hashlib
import hmac
import ipaddress
import os
import ssl
import struct
import threading
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE = 18, 17, 36
SASL_AUTHENTICATION_FAILED, UNSUPPORTED_SASL_MECHANISM = 58, 33
SCRAM = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}


@dataclass(frozen=True)
class Pki:
    """A test CA, a server certificate for 127.0.0.1 and a client certificate, as PEM files."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def make_pki(where: Path) -> Pki:
    now = datetime.datetime.now(datetime.UTC)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def issue(cn: str, key: ec.EllipticCurvePrivateKey, signer: ec.EllipticCurvePrivateKey,
              issuer: x509.Name, ca: bool) -> x509.Certificate:  # fmt: skip
        b = (x509.CertificateBuilder().subject_name(name(cn)).issuer_name(issuer)
             .public_key(key.public_key()).serial_number(x509.random_serial_number())
             .not_valid_before(now - datetime.timedelta(minutes=5))
             .not_valid_after(now + datetime.timedelta(days=1))
             .add_extension(x509.BasicConstraints(ca=ca, path_length=None),
                            critical=True))  # fmt: skip
        if cn == "localhost":
            b = b.add_extension(x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False)  # fmt: skip
        return b.sign(signer, hashes.SHA256())

    def write(path: Path, data: bytes) -> Path:
        path.write_bytes(data)
        return path

    def key_pem(k: ec.EllipticCurvePrivateKey) -> bytes:
        return k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                               serialization.NoEncryption())  # fmt: skip

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = issue("weir test ca", ca_key, ca_key, name("weir test ca"), True)
    files: dict[str, Path] = {
        "ca": write(where / "ca.pem", ca.public_bytes(serialization.Encoding.PEM))
    }
    for who, cn in (("server", "localhost"), ("client", "weir")):
        key = ec.generate_private_key(ec.SECP256R1())
        cert = issue(cn, key, ca_key, ca.subject, False)
        files[f"{who}_cert"] = write(
            where / f"{who}.pem", cert.public_bytes(serialization.Encoding.PEM)
        )
        files[f"{who}_key"] = write(where / f"{who}.key", key_pem(key))
    return Pki(**files)


async def _frame(reader: asyncio.StreamReader) -> bytes | None:
    """One request or response frame without its length, or None at the end of the stream."""
    try:
        head = await reader.readexactly(4)
        return await reader.readexactly(struct.unpack(">i", head)[0])
    except asyncio.IncompleteReadError:
        return None


def _framed(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def _string(s: str | None) -> bytes:
    return struct.pack(">h", -1) if s is None else struct.pack(">h", len(s)) + s.encode()


class KafkaFront:
    """Listens on a loopback port, in front of the broker at 127.0.0.1:``backend_port`` (which
    may be set after the front started: the broker needs the front's address first).
    """

    def __init__(self, *, pki: Pki | None = None, client_certs: bool = False,
                 users: dict[str, str] | None = None) -> None:  # fmt: skip
        self.backend_port: int | None = None
        self.users = users  # None: no SASL
        self.tls: ssl.SSLContext | None = None
        if pki is not None:
            self.tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            self.tls.load_cert_chain(pki.server_cert, pki.server_key)
            if client_certs:
                self.tls.load_verify_locations(pki.ca)
                self.tls.verify_mode = ssl.CERT_REQUIRED
        self.refused: list[str] = []  # why SASL turned clients away, for the tests to read
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="kafka-front")  # fmt: skip
        self.port = 0

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def __enter__(self) -> KafkaFront:
        self._thread.start()
        start = asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.tls)
        self._server = asyncio.run_coroutine_threadsafe(start, self._loop).result(10)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def __exit__(self, *exc: object) -> None:
        async def stop() -> None:
            self._server.close()
            for task in asyncio.all_tasks() - {asyncio.current_task()}:
                task.cancel()

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _broker(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        assert self.backend_port is not None, "KafkaFront has no broker behind it"
        return await asyncio.open_connection("127.0.0.1", self.backend_port)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.closing(writer), contextlib.suppress(OSError):  # e.g. the broker stopped
            if self.users is not None and not await self._authenticate(reader, writer):
                return
            b_reader, b_writer = await self._broker()
            with contextlib.closing(b_writer):
                pipes = [asyncio.ensure_future(_pipe(reader, b_writer)),
                         asyncio.ensure_future(_pipe(b_reader, writer))]  # fmt: skip
                await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
                for p in pipes:
                    p.cancel()

    async def _authenticate(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        """The broker's side of SaslHandshake and SaslAuthenticate; ApiVersions goes through
        to the broker, which lists both. True once the client proved who it is.
        """
        users = self.users or {}
        mechanism: str | None = None
        scram: _ScramServer | None = None
        while (frame := await _frame(reader)) is not None:
            api_key, version, corr = struct.unpack(">hhi", frame[:8])
            rest = frame[10 + max(struct.unpack(">h", frame[8:10])[0], 0) :]  # after client_id
            reply_head = struct.pack(">i", corr)
            if api_key == API_VERSIONS:
                b_reader, b_writer = await self._broker()
                with contextlib.closing(b_writer):
                    b_writer.write(_framed(frame))
                    answer = await _frame(b_reader)
                if answer is None:
                    return False
                writer.write(_framed(answer))
            elif api_key == SASL_HANDSHAKE:
                (n,) = struct.unpack(">h", rest[:2])
                mechanism = rest[2 : 2 + n].decode()
                offered = ["PLAIN", *SCRAM]
                err = 0 if mechanism in offered else UNSUPPORTED_SASL_MECHANISM
                body = struct.pack(">hi", err, len(offered)) + b"".join(map(_string, offered))
                writer.write(_framed(reply_head + body))
                if err:
                    self.refused.append(f"mechanism {mechanism}")
                    return False
            elif api_key == SASL_AUTHENTICATE and mechanism is not None and version <= 1:
                (n,) = struct.unpack(">i", rest[:4])
                token = rest[4 : 4 + n]
                if mechanism == "PLAIN":
                    _, user, password = token.decode().split("\0")
                    reply, ok, finished = b"", users.get(user) == password, True
                else:
                    scram = scram or _ScramServer(SCRAM[mechanism], users)
                    reply, ok, finished = scram.step(token)
                message = None if ok else "Authentication failed: invalid username or password"
                body = (struct.pack(">h", 0 if ok else SASL_AUTHENTICATION_FAILED)
                        + _string(message) + struct.pack(">i", len(reply)) + reply
                        + (struct.pack(">q", 0) if version >= 1 else b""))  # fmt: skip
                writer.write(_framed(reply_head + body))
                if not ok:
                    self.refused.append(f"{mechanism} authentication failed")
                    await writer.drain()
                    return False
                if finished:
                    return True
            else:
                self.refused.append(f"api {api_key} v{version} before authentication")
                return False
            await writer.drain()
        return False


class _ScramServer:
    """RFC 5802, the server's two steps."""

    def __init__(self, hash_name: str, users: dict[str, str]) -> None:
        self.hash, self.users = hash_name, users
        self.salt, self.iterations = os.urandom(16), 4096
        self.first_bare = self.server_first = ""
        self.nonce = ""
        self.salted = b""

    def _hmac(self, key: bytes, msg: bytes) -> bytes:
        return hmac.new(key, msg, self.hash).digest()

    def step(self, token: bytes) -> tuple[bytes, bool, bool]:
        """(reply, still fine, finished) for the client's next message."""
        text = token.decode()
        if not self.nonce:  # client-first: n,,n=user,r=nonce
            self.first_bare = text.split(",", 2)[2]
            fields = dict(f.split("=", 1) for f in self.first_bare.split(","))
            password = self.users.get(fields["n"])
            if password is None:
                return b"", False, True
            self.nonce = fields["r"] + base64.b64encode(os.urandom(12)).decode()
            self.salted = hashlib.pbkdf2_hmac(
                self.hash, password.encode(), self.salt, self.iterations
            )
            salt = base64.b64encode(self.salt).decode()
            self.server_first = f"r={self.nonce},s={salt},i={self.iterations}"
            return self.server_first.encode(), True, False
        without_proof, proof_field = text.rsplit(",", 1)  # client-final: c=..,r=..,p=proof
        fields = dict(f.split("=", 1) for f in without_proof.split(","))
        proof = base64.b64decode(proof_field.removeprefix("p="))
        auth = f"{self.first_bare},{self.server_first},{without_proof}".encode()
        client_key = self._hmac(self.salted, b"Client Key")
        stored = hashlib.new(self.hash, client_key).digest()
        signature = self._hmac(stored, auth)
        given_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        if fields.get("r") != self.nonce or hashlib.new(self.hash, given_key).digest() != stored:
            return b"", False, True
        server_signature = self._hmac(self._hmac(self.salted, b"Server Key"), auth)
        return b"v=" + base64.b64encode(server_signature), True, True


async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError):
        while chunk := await src.read(65536):
            dst.write(chunk)
            await dst.drain()
