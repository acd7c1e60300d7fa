"""How the settings reach the clients (aiokafka, redis) and the logs, with secrets kept out of the logs.

`ClientOptions` is a mixin of `stratameter.config.Settings`: its methods read the fields declared there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlsplit, urlunsplit

from pydantic import SecretStr
from redis.asyncio import Redis, RedisCluster

from .checks import MASK, QUERY_PASSWORD, mask_url


#: Connection options of the service's Redis client (seconds).
REDIS_TIMEOUTS = {"socket_timeout": 5, "socket_connect_timeout": 5, "health_check_interval": 10}


class ClientOptions:
    """Keyword arguments for the clients, and the settings as logs may show them."""

    # ---- clients

    def kafka_client_kwargs(self) -> dict[str, Any]:
        """Connection keyword arguments for aiokafka consumers and producers (includes the password)."""
        kw: dict[str, Any] = {"bootstrap_servers": self.kafka_bootstrap_servers,
                              "security_protocol": self.kafka_security_protocol}
        if self.kafka_security_protocol.startswith("SASL_"):
            kw.update(sasl_mechanism=self.kafka_sasl_mechanism, sasl_plain_username=self.kafka_sasl_username,
                      sasl_plain_password=self.kafka_sasl_password.get_secret_value()
                      if self.kafka_sasl_password else None)
        if self.kafka_security_protocol in ("SSL", "SASL_SSL"):
            from aiokafka.helpers import create_ssl_context

            kw["ssl_context"] = create_ssl_context(
                cafile=str(self.kafka_ssl_cafile) if self.kafka_ssl_cafile else None,
                certfile=str(self.kafka_ssl_certfile) if self.kafka_ssl_certfile else None,
                keyfile=str(self.kafka_ssl_keyfile) if self.kafka_ssl_keyfile else None)
        return kw

    def redis_client(self, **options) -> Redis | RedisCluster:
        """The client the service talks to Redis through: a single Redis (``redis.asyncio.Redis``)
        or, with REDIS_CLUSTER, a Redis Cluster (``redis.asyncio.RedisCluster``) discovered from the
        node REDIS_URL names.  Both take the same URL forms (``redis://``, ``rediss://`` with the
        same TLS files, ACL credentials); a cluster has only database 0 and no ``unix://`` (the
        settings refuse both at start).  Connects on first use; `options` override
        `REDIS_TIMEOUTS`."""
        kwargs = {**REDIS_TIMEOUTS, **self.redis_client_kwargs(), **options}
        cls = RedisCluster if self.redis_cluster else Redis
        return cls.from_url(self.redis_url_with_credentials(), **kwargs)

    def redis_client_kwargs(self) -> dict[str, Any]:
        """TLS keyword arguments for ``redis.asyncio.Redis.from_url`` (empty unless REDIS_SSL_* are set)."""
        kw: dict[str, Any] = {}
        for name, arg in (("redis_ssl_cafile", "ssl_ca_certs"), ("redis_ssl_certfile", "ssl_certfile"),
                          ("redis_ssl_keyfile", "ssl_keyfile")):
            if getattr(self, name) is not None:
                kw[arg] = str(getattr(self, name))
        return kw

    def redis_url_with_credentials(self) -> str:
        """`redis_url` with REDIS_USERNAME / REDIS_PASSWORD put in (they win over the URL's own)."""
        if self.redis_password is None and self.redis_username is None:
            return self.redis_url
        parts = urlsplit(self.redis_url)
        if parts.scheme == "unix":  # no netloc: credentials go in the query string
            query = "&".join(q for q in parts.query.split("&") if q and not q.startswith(("username=", "password=")))
            extra = []
            if self.redis_username is not None:
                extra.append("username=" + quote(self.redis_username, safe=""))
            if self.redis_password is not None:
                extra.append("password=" + quote(self.redis_password.get_secret_value(), safe=""))
            query = "&".join(([query] if query else []) + extra)
            return f"unix://{parts.netloc}{parts.path}?{query}" + (f"#{parts.fragment}" if parts.fragment else "")
        user = quote(self.redis_username, safe="") if self.redis_username is not None else (parts.username or "")
        if self.redis_password is not None:
            password = quote(self.redis_password.get_secret_value(), safe="")
        else:
            password = parts.password or ""
        host = parts.netloc.rpartition("@")[2]
        netloc = f"{user}:{password}@{host}" if password else f"{user}@{host}"
        return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))

    # ---- display

    def secret_values(self) -> list[str]:
        """The secrets to keep out of every log line: passwords, also the one inside REDIS_URL."""
        out = [p.get_secret_value() for p in (self.kafka_sasl_password, self.redis_password, self.label_studio_token)
               if p is not None]
        _scheme, _, rest = self.redis_url.partition("://")
        userinfo, at, _host = rest.rpartition("@")
        if at and ":" in userinfo:
            raw = userinfo.split(":", 1)[1]
            out += [raw, unquote(raw)]
        for match in QUERY_PASSWORD.finditer(self.redis_url):
            out.append(unquote(self.redis_url[match.end(1):match.end()]))
        return [v for v in dict.fromkeys(out) if v]

    def safe_dict(self) -> dict[str, Any]:
        """All settings as JSON-able values for logs: secrets and URL passwords masked."""
        out: dict[str, Any] = {}
        for name in type(self).model_fields:
            v = getattr(self, name)
            if isinstance(v, SecretStr):
                v = MASK
            elif isinstance(v, Path):
                v = str(v)
            elif name == "redis_url":
                v = mask_url(v)
            out[name] = v
        out["overridden_classifiers"] = list(self.overridden_classifiers)
        out["review_budgets"] = self.review_budgets
        return out

    def __repr_args__(self):  # type: ignore[no-untyped-def]
        for name, v in super().__repr_args__():  # type: ignore[misc]
            yield name, (mask_url(v) if name == "redis_url" and isinstance(v, str) else v)
