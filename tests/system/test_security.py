"""Security settings against real peers: Kafka SASL (PLAIN, SCRAM-SHA-256/512) and TLS
(server and client certificates), Redis ACL users and TLS (rediss://), secrets from env
and from mounted files, and that no secret ever reaches the logs, /metrics or /v1.

Peers (see tests/embedded_tls.py for why):

* Redis: redis-server itself with ``--user`` ACLs (``default`` disabled) and ``--tls-port``
  (client certificates required), certificates from a throw-away CA made with openssl.
* Kafka: tansu 0.6 cannot authenticate or serve TLS itself, so a tansu broker sits behind
  `KafkaSecurityProxy`, which terminates TLS (optionally requiring a client certificate)
  and performs the SASL exchange (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512) like a Kafka
  broker, then forwards the connection to tansu.  Every client in these tests -- the
  service, the test's producer and admin -- connects through it with the service's own
  `Settings.kafka_client_kwargs()`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import ssl
import subprocess
import sys
import time

import orjson
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from stratameter.app.runner import Service
from stratameter.config import ConfigError, load_settings
from stratameter.embedded import BackendError, EmbeddedRedis, find_free_port, redis_binary
from stratameter.errors import StartupError
from tests.embedded_tls import (
    EmbeddedKafkaBehind,
    EmbeddedSecureRedis,
    KafkaSecurityProxy,
    make_tls_files,
    openssl_binary,
    server_ssl_context,
)
from tests.harness import ServiceProcess, http_get, http_json, running_service, serving, wait_for
from tests.settings_env import P
from tests.settings_env import env as _env  # `env` is a local name of its tests

KAFKA_USER, KAFKA_SECRET = "svc-kafka", "kafka-Secret-7f3a9c!pw"
REDIS_USER, REDIS_SECRET = "svc-redis", "redis-Secret-c41d2e#pw"
SECRETS = (KAFKA_SECRET, REDIS_SECRET)


def _load(**values: str):
    return load_settings(_env(**values))


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory):
    try:
        openssl_binary()
    except BackendError as exc:
        pytest.skip(str(exc))
    return make_tls_files(tmp_path_factory.mktemp("tls"))


def _redis_has_tls() -> bool:
    """Debian's redis-server 7 links OpenSSL (BUILD_TLS=yes); other builds may not."""
    try:
        ldd = subprocess.run(["ldd", redis_binary()], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError, BackendError):
        return False
    return "libssl" in ldd


# --------------------------------------------------------------------------- config level


def test_kafka_client_kwargs_per_protocol(tls_files):
    files = dict(kafka_ssl_cafile=str(tls_files.ca), kafka_ssl_certfile=str(tls_files.client_cert),
                 kafka_ssl_keyfile=str(tls_files.client_key))
    sasl = dict(kafka_sasl_username=KAFKA_USER, kafka_sasl_password=KAFKA_SECRET)
    assert _load().kafka_client_kwargs() == {"bootstrap_servers": "localhost:9092", "security_protocol": "PLAINTEXT"}
    for mechanism in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"):
        kw = _load(kafka_security_protocol="SASL_PLAINTEXT", kafka_sasl_mechanism=mechanism, **sasl)
        assert kw.kafka_client_kwargs() == {
            "bootstrap_servers": "localhost:9092", "security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": mechanism,
            "sasl_plain_username": KAFKA_USER, "sasl_plain_password": KAFKA_SECRET}
    kw = _load(kafka_security_protocol="SASL_SSL", kafka_sasl_mechanism="SCRAM-SHA-512", **sasl,
               **files).kafka_client_kwargs()
    assert kw["sasl_mechanism"] == "SCRAM-SHA-512" and kw["sasl_plain_password"] == KAFKA_SECRET
    ctx = kw["ssl_context"]
    assert isinstance(ctx, ssl.SSLContext)
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname
    assert [dict(x[0] for x in c["subject"])["commonName"] for c in ctx.get_ca_certs()] == ["stratameter ca"]
    kw = _load(kafka_security_protocol="SSL", **files).kafka_client_kwargs()
    assert set(kw) == {"bootstrap_servers", "security_protocol", "ssl_context"}
    # SSL without a CA file: the system's trust store, still verifying the broker's name
    ctx = _load(kafka_security_protocol="SSL").kafka_client_kwargs()["ssl_context"]
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname


def test_redis_tls_settings(tls_files, tmp_path):
    s = _load(redis_url="rediss://redis.example:6380/2", redis_ssl_cafile=str(tls_files.ca),
              redis_ssl_certfile=str(tls_files.client_cert), redis_ssl_keyfile=str(tls_files.client_key))
    assert s.redis_client_kwargs() == {"ssl_ca_certs": str(tls_files.ca), "ssl_certfile": str(tls_files.client_cert),
                                       "ssl_keyfile": str(tls_files.client_key)}
    assert s.safe_dict()["redis_ssl_cafile"] == str(tls_files.ca)
    assert _load().redis_client_kwargs() == {}
    assert _load(redis_url="rediss://r:6380/0").redis_client_kwargs() == {}  # system CAs
    with pytest.raises(ConfigError) as info:
        _load(redis_ssl_cafile=str(tls_files.ca))
    assert str(info.value) == f"{P}REDIS_SSL_CAFILE: needs a rediss:// {P}REDIS_URL (TLS), got redis://"
    with pytest.raises(ConfigError) as info:
        _load(redis_url="rediss://r:6380/0", redis_ssl_keyfile=str(tls_files.client_key))
    assert str(info.value) == f"{P}REDIS_SSL_KEYFILE: needs {P}REDIS_SSL_CERTFILE"
    with pytest.raises(ConfigError) as info:
        _load(redis_url="rediss://r:6380/0", redis_ssl_cafile=str(tmp_path / "nope.pem"))
    assert str(info.value).startswith(f"{P}REDIS_SSL_CAFILE: is not a readable file")


def test_config_errors_never_include_secrets(tmp_path):
    (tmp_path / "kafka-pw").write_text(KAFKA_SECRET + "\n")
    bad = [
        _env(kafka_security_protocol="SASL_SSL", kafka_sasl_mechanism="GSSAPI", kafka_sasl_username=KAFKA_USER,
             kafka_sasl_password=KAFKA_SECRET, redis_password=REDIS_SECRET, delta="9"),
        _env(kafka_security_protocol="SASL_SSL", kafka_sasl_username=KAFKA_USER,
             kafka_sasl_password_file=str(tmp_path / "kafka-pw"), kafka_sasl_password=KAFKA_SECRET),
        _env(redis_url=f"redis://{REDIS_USER}:{REDIS_SECRET}@host:notaport/0"),
        _env(redis_url=f"http://{REDIS_USER}:{REDIS_SECRET}@host:6379/0"),
        _env(redis_url=f"redis://{REDIS_USER}:{REDIS_SECRET}@host:6379/0", redis_ssl_cafile=str(tmp_path / "kafka-pw")),
        {**_env(redis_password=REDIS_SECRET), P + "REDIS_PASSWORD_FILE": str(tmp_path / "missing")},
    ]
    for environ in bad:
        with pytest.raises(ConfigError) as info:
            load_settings(environ)
        for secret in SECRETS:
            assert secret not in str(info.value), str(info.value)
            assert all(secret not in msg for _var, msg in info.value.errors)


# --------------------------------------------------------------------------- Redis peers

async def _count_scores(run, cid: str, n: int) -> None:
    now_ms = int(time.time() * 1000)
    for i in range(n):
        await run.send_score(classifier_id=cid, item_id=f"{cid}-{i}", score=0.5 + (i % 50) / 100, event_time=now_ms)
    await run.producer.flush()

    async def counted():
        status, doc = await http_json(run.port, f"/v1/classifiers/{cid}")
        return status == 200 and doc["scores"] == n

    await wait_for(counted, 60, f"{n} scores of {cid} counted")


@pytest.mark.integration
async def test_redis_acl_user_and_password(kafka_bootstrap, unique_name, tmp_path):
    (tmp_path / "redis-pw").write_text(REDIS_SECRET + "\n")
    with EmbeddedSecureRedis(users={REDIS_USER: REDIS_SECRET}) as redis:
        # the default user is off: without credentials nothing works
        async with running_service(kafka_bootstrap, redis.url, unique_name, REDIS_USERNAME=REDIS_USER,
                                   REDIS_PASSWORD_FILE=str(tmp_path / "redis-pw")) as run:
            await _count_scores(run, "acl-clf", 40)
            assert (await run.get("/readyz"))[0] == 200
        # credentials in the URL work too (percent-encoded by the operator)
        from urllib.parse import quote
        url = f"redis://{REDIS_USER}:{quote(REDIS_SECRET, safe='')}@{redis.address}/0"
        async with running_service(kafka_bootstrap, url, unique_name) as run:
            await _count_scores(run, "acl-url", 10)


@pytest.mark.integration
async def test_redis_wrong_password_fails_start_clearly(caplog, unique_name):
    caplog.set_level(logging.DEBUG)
    with EmbeddedSecureRedis(users={REDIS_USER: "the-right-one"}) as redis:
        for user in (REDIS_USER, None):
            settings = load_settings(_env(redis_url=redis.url, redis_password=REDIS_SECRET,
                                          **({"redis_username": user} if user else {})))
            service = Service(settings)
            with pytest.raises(StartupError) as info:
                await service.start()
            await service.redis.aclose()
            msg = str(info.value)
            assert f"Redis at {redis.url} rejected the credentials of user {user or 'default'!r}" in msg
            assert "AuthenticationError" in msg and "STRATAMETER_REDIS_PASSWORD" in msg
            assert REDIS_SECRET not in msg
    assert REDIS_SECRET not in caplog.text


@pytest.mark.integration
@pytest.mark.skipif(not _redis_has_tls(), reason="the Redis server found is not built with TLS")
async def test_redis_tls_with_ca_and_client_certificate(kafka_bootstrap, unique_name, tls_files, caplog):
    with EmbeddedSecureRedis(users={REDIS_USER: REDIS_SECRET}, tls=tls_files) as redis:
        assert redis.url.startswith("rediss://")
        tls = dict(REDIS_SSL_CAFILE=str(tls_files.ca), REDIS_SSL_CERTFILE=str(tls_files.client_cert),
                   REDIS_SSL_KEYFILE=str(tls_files.client_key))
        async with running_service(kafka_bootstrap, redis.url, unique_name, REDIS_USERNAME=REDIS_USER,
                                   REDIS_PASSWORD=REDIS_SECRET, **tls) as run:
            await _count_scores(run, "tls-clf", 30)
            assert (await run.get("/readyz"))[0] == 200
        # a server certificate from another CA: never ready, and the log says why
        caplog.set_level(logging.WARNING, logger="stratameter")
        async with running_service(kafka_bootstrap, redis.url, unique_name, REDIS_USERNAME=REDIS_USER,
                                   REDIS_PASSWORD=REDIS_SECRET, **{**tls, "REDIS_SSL_CAFILE": str(tls_files.other_ca)}
                                   ) as run:
            await asyncio.sleep(2.5)
            assert (await run.get("/readyz"))[0] == 503
        assert "certificate verify failed" in caplog.text.lower()
        # no client certificate: the server refuses the handshake
        caplog.clear()
        async with running_service(kafka_bootstrap, redis.url, unique_name, REDIS_USERNAME=REDIS_USER,
                                   REDIS_PASSWORD=REDIS_SECRET, REDIS_SSL_CAFILE=str(tls_files.ca)) as run:
            await asyncio.sleep(2.5)
            assert (await run.get("/readyz"))[0] == 503
        assert "redis probe failed: ConnectionError" in caplog.text
        assert REDIS_SECRET not in caplog.text


# --------------------------------------------------------------------------- Kafka peers


@contextlib.asynccontextmanager
async def secure_kafka(tls_files, *, tls: bool, client_cert: bool, mechanisms=()):
    """tansu behind a `KafkaSecurityProxy` (TLS and/or SASL); yields the proxy."""
    port = find_free_port()
    ctx = server_ssl_context(tls_files, require_client_cert=client_cert) if tls else None
    with EmbeddedKafkaBehind(f"127.0.0.1:{port}") as kafka:
        async with KafkaSecurityProxy(kafka.bootstrap, ssl_context=ctx, users={KAFKA_USER: KAFKA_SECRET},
                                      mechanisms=mechanisms, port=port) as proxy:
            yield proxy


@contextlib.asynccontextmanager
async def secured_service(env: dict[str, str], unique_name):
    """Like `tests.harness.running_service`, but every Kafka client uses the settings' security."""
    topics = {name: unique_name(name) for name in ("scores", "requests", "labels", "dlq")}
    port = find_free_port()
    settings = load_settings(_env(
        kafka_consumer_group=unique_name("group"), kafka_session_timeout_ms="6000", redis_key_prefix=unique_name("sm"),
        topic_scores=topics["scores"], topic_label_requests=topics["requests"], topic_labels=topics["labels"],
        topic_dead_letter=topics["dlq"], http_port=str(port)) | env)
    kw = settings.kafka_client_kwargs()
    admin = AIOKafkaAdminClient(**kw)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(t, 3, 1) for t in topics.values()])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(enable_idempotence=False, **kw)
    await producer.start()
    async with serving(Service(settings), port, topics, producer, settings.kafka_bootstrap_servers) as run:
        yield run


KAFKA_CASES = {
    # id: (security protocol, mechanism, TLS, client certificate)
    "sasl_plaintext-plain": ("SASL_PLAINTEXT", "PLAIN", False, False),
    "sasl_plaintext-scram256": ("SASL_PLAINTEXT", "SCRAM-SHA-256", False, False),
    "sasl_ssl-scram512-mtls": ("SASL_SSL", "SCRAM-SHA-512", True, True),
    "ssl-mtls": ("SSL", None, True, True),
    "ssl-server-only": ("SSL", None, True, False),
}


@pytest.mark.integration
@pytest.mark.parametrize("case", list(KAFKA_CASES))
async def test_kafka_security(case, tls_files, redis_url, unique_name, tmp_path):
    protocol, mechanism, tls, client_cert = KAFKA_CASES[case]
    async with secure_kafka(tls_files, tls=tls, client_cert=client_cert,
                            mechanisms=(mechanism,) if mechanism else ()) as proxy:
        env = _env(kafka_bootstrap_servers=proxy.bootstrap, kafka_security_protocol=protocol, redis_url=redis_url)
        if mechanism:
            (tmp_path / "kafka-pw").write_text(KAFKA_SECRET)
            env |= _env(kafka_sasl_mechanism=mechanism, kafka_sasl_username=KAFKA_USER,
                        kafka_sasl_password_file=str(tmp_path / "kafka-pw"))
        if tls:
            env |= _env(kafka_ssl_cafile=str(tls_files.ca))
        if client_cert:
            env |= _env(kafka_ssl_certfile=str(tls_files.client_cert), kafka_ssl_keyfile=str(tls_files.client_key))
        async with secured_service(env, unique_name) as run:
            await _count_scores(run, f"k-{case}", 25)
            assert (await run.get("/readyz"))[0] == 200
        assert len(proxy.sessions) >= 3  # admin, producer, the service's producer and consumer
        for s in proxy.sessions:
            assert s.tls == tls and s.client_cert == client_cert, s
            if mechanism:
                assert (s.mechanism, s.user, s.authenticated, s.error) == (mechanism, KAFKA_USER, True, None), s


@pytest.mark.integration
@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
async def test_kafka_wrong_password_fails_start_clearly(mechanism, tls_files, redis_url, caplog):
    # INFO, as in the service (aiokafka's DEBUG lines show the PLAIN token: `configure_logging`
    # keeps aiokafka at WARNING and `redact` masks it anyway, see test_log_redaction)
    caplog.set_level(logging.INFO)
    async with secure_kafka(tls_files, tls=True, client_cert=False, mechanisms=(mechanism,)) as proxy:
        settings = load_settings(_env(
            kafka_bootstrap_servers=proxy.bootstrap, kafka_security_protocol="SASL_SSL", kafka_sasl_mechanism=mechanism,
            kafka_sasl_username=KAFKA_USER, kafka_sasl_password="not-" + KAFKA_SECRET,
            kafka_ssl_cafile=str(tls_files.ca), redis_url=redis_url, startup_timeout_seconds="0"))
        service = Service(settings)
        with pytest.raises(StartupError) as info:
            await service.start()
        await service.stop()
    msg = str(info.value)
    assert msg.startswith(f"cannot connect to Kafka at {proxy.bootstrap} (SASL_SSL with SASL {mechanism} as user "
                          f"'{KAFKA_USER}'): KafkaConnectionError"), msg
    assert "SaslAuthenticationFailed" in caplog.text  # aiokafka's own line names the broker's answer
    assert KAFKA_SECRET not in msg and KAFKA_SECRET not in caplog.text
    assert proxy.sessions and not any(s.authenticated for s in proxy.sessions)


@pytest.mark.integration
async def test_kafka_tls_untrusted_server_certificate(tls_files, redis_url):
    async with secure_kafka(tls_files, tls=True, client_cert=False) as proxy:
        settings = load_settings(_env(kafka_bootstrap_servers=proxy.bootstrap, kafka_security_protocol="SSL",
                                      kafka_ssl_cafile=str(tls_files.other_ca), redis_url=redis_url,
                                      startup_timeout_seconds="0"))
        service = Service(settings)
        with pytest.raises(StartupError, match=r"cannot connect to Kafka at .* \(SSL\)"):
            await service.start()
        await service.stop()


# --------------------------------------------------------------------------- secrets never shown


def test_log_redaction():
    from urllib.parse import quote

    from stratameter.app.logs import JsonFormatter

    fmt = JsonFormatter()
    settings = _load(kafka_security_protocol="SASL_SSL", kafka_sasl_username=KAFKA_USER,
                     kafka_sasl_password=KAFKA_SECRET,
                     redis_url=f"redis://{REDIS_USER}:{quote(REDIS_SECRET, safe='')}@h:6379/0")
    assert set(settings.secret_values()) >= {KAFKA_SECRET, REDIS_SECRET}
    fmt.add_secrets(settings.secret_values() + ["ab"])  # too short to redact: ignored
    logger = logging.getLogger("test.redaction")
    try:
        raise ValueError(f"bad {KAFKA_SECRET!r} and {settings.redis_url_with_credentials()}")
    except ValueError:
        record = logger.makeRecord("test", logging.DEBUG, __file__, 1, "token %r in %s", (
            f"\x00{KAFKA_SECRET}".encode(), {"pw": REDIS_SECRET}), sys.exc_info(), extra={"x": KAFKA_SECRET})
    line = fmt.format(record)
    for secret in SECRETS:
        for form in (secret, quote(secret, safe=""), orjson.dumps(secret).decode()[1:-1]):
            assert form not in line, line
    assert line.count("**********") >= 5 and "ab" not in fmt.secrets
    assert orjson.loads(line)["level"] == "debug"
    assert _load(redis_url="unix:///r.sock?password=qwerty12&db=0").secret_values() == ["qwerty12"]



def _service_env(port: int, topics: dict[str, str], group: str, prefix: str, **settings: str) -> dict[str, str]:
    base = {"KAFKA_CONSUMER_GROUP": group, "KAFKA_SESSION_TIMEOUT_MS": "6000", "REDIS_KEY_PREFIX": prefix,
            "TOPIC_SCORES": topics["scores"], "TOPIC_LABEL_REQUESTS": topics["requests"],
            "TOPIC_LABELS": topics["labels"], "TOPIC_DEAD_LETTER": topics["dlq"], "HTTP_PORT": str(port),
            "HTTP_HOST": "127.0.0.1", "INSTANCE_ID": "secret-test", "LOG_LEVEL": "DEBUG", **settings}
    clean = {k: v for k, v in os.environ.items() if not k.startswith(P)}
    return {**clean, **{P + k: v for k, v in base.items()}}


@pytest.mark.integration
@pytest.mark.skipif(not _redis_has_tls(), reason="the Redis server found is not built with TLS")
@pytest.mark.parametrize("from_file", ["kafka", "redis"])
async def test_secrets_never_in_logs_metrics_or_api(from_file, tls_files, unique_name, tmp_path):
    """`stratameter run` at LOG_LEVEL=DEBUG with SASL_SSL/SCRAM-SHA-512 Kafka and an ACL user on
    a TLS Redis, one password from a mounted file, the other from the environment: it works,
    and the two passwords appear in no log line, no /metrics, no /v1 answer."""
    (tmp_path / "kafka-pw").write_text(KAFKA_SECRET + "\n")
    (tmp_path / "redis-pw").write_text(REDIS_SECRET + "\n")
    topics = {name: unique_name(name) for name in ("scores", "requests", "labels", "dlq")}
    cid = "secret-clf"
    async with secure_kafka(tls_files, tls=True, client_cert=True, mechanisms=("SCRAM-SHA-512",)) as proxy:
        with EmbeddedSecureRedis(users={REDIS_USER: REDIS_SECRET}, tls=tls_files) as redis:
            kafka = dict(KAFKA_BOOTSTRAP_SERVERS=proxy.bootstrap, KAFKA_SECURITY_PROTOCOL="SASL_SSL",
                         KAFKA_SASL_MECHANISM="SCRAM-SHA-512", KAFKA_SASL_USERNAME=KAFKA_USER,
                         KAFKA_SSL_CAFILE=str(tls_files.ca),
                         KAFKA_SSL_CERTFILE=str(tls_files.client_cert), KAFKA_SSL_KEYFILE=str(tls_files.client_key))
            red = dict(REDIS_URL=redis.url, REDIS_USERNAME=REDIS_USER,
                       REDIS_SSL_CAFILE=str(tls_files.ca), REDIS_SSL_CERTFILE=str(tls_files.client_cert),
                       REDIS_SSL_KEYFILE=str(tls_files.client_key))
            if from_file == "kafka":
                kafka["KAFKA_SASL_PASSWORD_FILE"], red["REDIS_PASSWORD"] = str(tmp_path / "kafka-pw"), REDIS_SECRET
            else:
                kafka["KAFKA_SASL_PASSWORD"], red["REDIS_PASSWORD_FILE"] = KAFKA_SECRET, str(tmp_path / "redis-pw")
            port = find_free_port()
            env = _service_env(port, topics, unique_name("group"), unique_name("sm"), **kafka, **red)
            settings = load_settings({k: v for k, v in env.items() if k.startswith(P)})
            kw = settings.kafka_client_kwargs()
            admin = AIOKafkaAdminClient(**kw)
            await admin.start()
            await admin.create_topics([NewTopic(t, 3, 1) for t in topics.values()])
            await admin.close()
            log_path = tmp_path / "service.log"
            proc = ServiceProcess(env, port, str(log_path)).start()
            bodies: list[bytes] = []
            try:
                producer = AIOKafkaProducer(enable_idempotence=False, **kw)
                await producer.start()
                try:
                    now_ms = int(time.time() * 1000)
                    for i in range(20):
                        await producer.send(topics["scores"], key=cid.encode(), value=orjson.dumps(
                            {"classifier_id": cid, "item_id": f"i{i}", "score": 0.6 + i / 100, "event_time": now_ms}))
                    await producer.send(topics["scores"], key=b"junk", value=b"{not json")
                    await producer.flush()

                    async def counted():
                        assert proc.alive, log_path.read_text()[-3000:]
                        status, doc = await http_json(port, f"/v1/classifiers/{cid}")
                        return status == 200 and doc["scores"] == 20

                    await wait_for(counted, 60, "the scores counted by the subprocess")
                    await wait_for(lambda: _ready(port), 20, "/readyz 200")
                    await wait_for(lambda: _owns_metrics(port, cid), 30, "the classifier's gauges on /metrics")
                    for path in ("/metrics", "/v1/classifiers", f"/v1/classifiers/{cid}", "/readyz", "/healthz",
                                 "/nope"):
                        bodies.append((await http_get(port, path))[1])
                finally:
                    await producer.stop()
            finally:
                # not proc.terminate(): its blocking wait would stall the proxy, which runs in this loop
                proc.proc.send_signal(signal.SIGTERM)
                rc = await asyncio.to_thread(proc.proc.wait, 30)
    logs = log_path.read_text()
    assert rc == 0, logs[-3000:]
    assert '"level":"debug"' in logs  # DEBUG really was on
    started = next(orjson.loads(line) for line in logs.splitlines() if '"stratameter started"' in line)
    assert started["settings"]["kafka_sasl_password"] == "**********"
    assert started["settings"]["redis_password"] == "**********"
    for secret in SECRETS:
        assert secret not in logs
        for body in bodies:
            assert secret.encode() not in body
    assert all(s.authenticated and s.client_cert for s in proxy.sessions)


async def _ready(port: int) -> bool:
    return (await http_get(port, "/readyz"))[0] == 200


async def _owns_metrics(port: int, cid: str) -> bool:
    return f'stratameter_scores_total{{classifier="{cid}"}}' in (await http_get(port, "/metrics"))[1].decode()


@pytest.mark.integration
async def test_subprocess_errors_never_show_secrets(tmp_path, kafka_bootstrap, unique_name):
    """A configuration error (exit 2) and a rejected Redis password (exit 1) name the
    problem and never the secret."""
    topics = {name: unique_name(name) for name in ("scores", "requests", "labels", "dlq")}
    port = find_free_port()
    env = _service_env(port, topics, unique_name("g"), unique_name("sm"), KAFKA_SECURITY_PROTOCOL="SASL_SSL",
                       KAFKA_SASL_MECHANISM="SCRAM-SHA-1", KAFKA_SASL_USERNAME=KAFKA_USER,
                       KAFKA_SASL_PASSWORD=KAFKA_SECRET, REDIS_URL=f"redis://u:{REDIS_SECRET}@h:99999/0")
    proc = subprocess.run([sys.executable, "-m", "stratameter.cli", "run"], env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert f"{P}KAFKA_SASL_MECHANISM: must be one of" in proc.stderr and f"{P}REDIS_URL" in proc.stderr
    for secret in SECRETS:
        assert secret not in proc.stderr + proc.stdout
    with EmbeddedSecureRedis(users={REDIS_USER: "the-right-one"}) as redis:
        env = _service_env(port, topics, unique_name("g"), unique_name("sm"), KAFKA_BOOTSTRAP_SERVERS=kafka_bootstrap,
                           REDIS_URL=redis.url, REDIS_USERNAME=REDIS_USER, REDIS_PASSWORD=REDIS_SECRET)
        proc = subprocess.run([sys.executable, "-m", "stratameter.cli", "run"], env=env, capture_output=True, text=True,
                              timeout=60)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "rejected the credentials of user 'svc-redis'" in proc.stderr
    for secret in SECRETS:
        assert secret not in proc.stderr + proc.stdout


def test_plain_embedded_redis_still_works_unsecured():
    """The secure subclass leaves `EmbeddedRedis` itself alone (no users, no TLS)."""
    assert "--tls-port" not in EmbeddedRedis()._argv() and "--user" not in EmbeddedRedis()._argv()


@pytest.mark.integration
def test_a_taken_http_port_is_one_line_naming_the_setting(unique_name):
    """Like every start failure: exit 1 and one line naming the setting, no traceback."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        topics = {name: unique_name(name) for name in ("scores", "requests", "labels", "dlq")}
        env = _service_env(port, topics, unique_name("g"), unique_name("sm"))
        proc = subprocess.run([sys.executable, "-m", "stratameter.cli", "run"], env=env, capture_output=True,
                              text=True, timeout=60)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert f"cannot listen on 127.0.0.1:{port}" in proc.stderr and "STRATAMETER_HTTP_PORT" in proc.stderr
    assert "Traceback" not in proc.stderr
