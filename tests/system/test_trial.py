"""The trial of docs/getting-started/your-own-producer.md converges (issue 50): `stratameter run` on the
settings of examples/trial.env, examples/reviewer.py answering (one request in ten skipped) and
examples/producer.py sending its 5,000 synthetic scores, each a subprocess as a user runs it, reach
`converged` with an interval within delta, close to the precision the producer knows.

The trial block is used as it is; only what ties the run to the test's backends changes: the broker,
Redis, the four topics, the key prefix, the consumer group and the HTTP port (`service_env`).  The
scripts take the broker and topics from the service's settings, as the page says.  The producer's
scores are stamped now: its burst (a second or two) is started away from a chunk's last seconds, so
that it lands in one chunk (a burst across a chunk boundary leaves a few records in the next chunk,
whose status is the reported one and says `converged` only after that chunk closes, minutes later).

Measured: 10-12 s from the producer's start to `converged` (about 330 labels), 30 s for the test on
the 2-core VM; the bound below leaves a loaded CI machine five times that."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from stratameter.embedded import find_free_port
from tests.harness import ServiceProcess, http_get, http_json, service_env, service_topics, trial_settings, wait_for

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
CONVERGED_WITHIN_SECONDS = 60
BURST_MARGIN_SECONDS = 15  # the producer starts no later than this before a chunk's end


async def test_the_trial_configuration_converges_with_the_example_scripts(kafka_bootstrap, redis_url, unique_name,
                                                                           tmp_path):
    trial = trial_settings()
    topics = await service_topics(kafka_bootstrap, unique_name, 3)
    port = find_free_port()
    settings = {**trial, **service_env(kafka_bootstrap, redis_url, topics, unique_name, HTTP_PORT=str(port),
                                       HTTP_HOST="127.0.0.1")}
    env = {**os.environ, **{f"STRATAMETER_{k}": v for k, v in settings.items()}}
    service = ServiceProcess(env, port, str(tmp_path / "service.log")).start()
    scripts: list[subprocess.Popen] = []
    try:
        await wait_for(lambda: _ready(port), 60, "the service's /readyz")
        scripts.append(_script(env, "reviewer.py", "--skip", "0.1", "--group", unique_name("reviewers")))
        await _away_from_a_chunk_end(int(trial["CHUNK_SECONDS"]))
        started = time.monotonic()
        scripts.append(_script(env, "producer.py", stdout=subprocess.PIPE))  # the page's command: my-classifier
        doc = await wait_for(lambda: _converged(port, "my-classifier"), CONVERGED_WITHIN_SECONDS,
                             f"`converged` with the trial settings {trial}")
        took = time.monotonic() - started
        producer_out = scripts[1].communicate(timeout=30)[0]
        assert scripts[1].returncode == 0 and scripts[0].poll() is None  # the reviewer still answers
    except BaseException:
        print(service.log_tail())
        raise
    finally:
        for proc in [*scripts, service.proc]:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(20)
    truth = float(re.search(r"true precision of the labelled predicted positives: ([0-9.]+)", producer_out)[1])
    halfwidth = (doc["ci_upper"] - doc["ci_lower"]) / 2
    print(f"converged {took:.1f} s after the producer started: {doc['labels']} labels, estimate "
          f"{doc['estimate']:.3f} +- {halfwidth:.3f}, truth {truth:.3f}")
    assert doc["scores"] == 5000 and not doc["closed"]
    assert halfwidth <= float(trial["DELTA"])
    assert abs(doc["estimate"] - truth) <= 2 * float(trial["DELTA"])  # ~4 standard errors
    assert doc["labels_by_outcome"]["skipped"] > 0 and doc["labels_by_outcome"]["accepted"] == doc["labels"]


def _script(env: dict[str, str], name: str, *args: str, stdout=subprocess.DEVNULL) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(EXAMPLES / name), *args], env=env, stdout=stdout, text=True)


async def _ready(port: int) -> bool:
    try:
        return (await http_get(port, "/readyz"))[0] == 200
    except OSError:
        return False


async def _converged(port: int, cid: str) -> dict | None:
    status, doc = await http_json(port, f"/v1/classifiers/{cid}")
    return doc if status == 200 and doc["status"] == "converged" else None


async def _away_from_a_chunk_end(chunk_seconds: int) -> None:
    """Until the current chunk has more than `BURST_MARGIN_SECONDS` left (see the module's docstring)."""
    left = chunk_seconds - time.time() % chunk_seconds
    if left <= BURST_MARGIN_SECONDS:
        await asyncio.sleep(left + 0.5)
