"""`stratameter backends`: the bundled broker and Redis a user starts to try `stratameter run`."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys

import pytest
import redis
from aiokafka.admin import AIOKafkaAdminClient

from stratameter.embedded import kafka_metadata

pytestmark = pytest.mark.integration


def test_backends_command_starts_a_broker_and_redis_and_stops_both_on_sigterm():
    proc = subprocess.Popen([sys.executable, "-m", "stratameter.cli", "backends", "--json"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        env = json.loads(proc.stdout.readline())
        bootstrap, url = env["STRATAMETER_KAFKA_BOOTSTRAP_SERVERS"], env["STRATAMETER_REDIS_URL"]
        assert redis.Redis.from_url(url).ping()
        assert kafka_metadata(bootstrap)
        async def topics():
            admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
            await admin.start()
            try:
                return set(await admin.list_topics())
            finally:
                await admin.close()

        assert {"stratameter.scores", "stratameter.label-requests", "stratameter.labels",
                "stratameter.dead-letter"} <= asyncio.run(topics())
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
    with pytest.raises(redis.ConnectionError):
        redis.Redis.from_url(url, socket_connect_timeout=1).ping()
