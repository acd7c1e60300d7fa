"""A chunk id counts chunks of `CHUNK_SECONDS` since the epoch, so the state under a key prefix is
only readable with the chunk length it was written with.  Before the service refused another one,
600-second chunks followed by 3600-second ones read as chunks in the year 2311, counted as the
newest: the retention purged the reservoir of the chunk being sampled and never purged again."""

from __future__ import annotations

import pytest

from stratameter.app.runner import Service, StartupError
from stratameter.config import load_settings

pytestmark = pytest.mark.integration


async def test_the_service_refuses_another_chunk_length_than_its_state_was_written_with(
        kafka_bootstrap, redis_url, unique_name):
    prefix = unique_name("len")

    def service(chunk_seconds: int) -> Service:
        return Service(load_settings({"STRATAMETER_KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
                                      "STRATAMETER_REDIS_URL": redis_url, "STRATAMETER_REDIS_KEY_PREFIX": prefix,
                                      "STRATAMETER_CHUNK_SECONDS": str(chunk_seconds)}))

    first = service(600)
    await first.start()  # the first start notes the length
    await first.stop()
    longer = service(3600)
    with pytest.raises(StartupError) as info:
        await longer.start()
    await longer.stop()
    assert str(info.value) == (
        f"STRATAMETER_CHUNK_SECONDS is 3600, but the state under STRATAMETER_REDIS_KEY_PREFIX {prefix!r} was "
        "written with 600-second chunks: keep 600, or give the new length a key prefix of its own (its state "
        "starts empty)")
    again = service(600)
    await again.start()
    await again.stop()
