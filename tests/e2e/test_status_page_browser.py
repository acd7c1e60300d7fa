"""The status page in a real browser: the service on the real broker and Redis, a reviewer
answering, then headless Chromium (Debian's ``chromium`` and ``chromium-driver``, driven by
Selenium) opens ``/``, finds the classifier with its window, last closed and current figures,
follows its link and sees the history chart and the strata.

The screenshot is saved in the test's temp dir; with ``STRATAMETER_TEST_SCREENSHOT=<path>`` also
there (``docs/status-page.png`` was taken so)."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import orjson
import pytest

from stratameter.chunks.lifecycle import STATUSES
from tests.e2e.test_label_studio_browser import _browser
from tests.harness import Reviewer, running_service, wait_for

pytestmark = pytest.mark.integration


def _look(url: str, cid: str, shot: Path) -> dict:
    """Open the overview, then the classifier's page; what each shows."""
    from selenium.webdriver.common.by import By

    profile = tempfile.mkdtemp(prefix="stratameter-chromium-")
    driver = _browser(profile)
    try:
        driver.get(url + "/")
        row = driver.find_element(By.XPATH, f"//tr[td/a[text()='{cid}']]").text
        driver.find_element(By.LINK_TEXT, cid).click()
        title = driver.find_element(By.TAG_NAME, "h1").text
        charts = len(driver.find_elements(By.TAG_NAME, "svg"))
        strata = len(driver.find_elements(By.XPATH, "//h2[text()='strata of the current chunk']/following::tr")) - 1
        driver.save_screenshot(str(shot))
        return {"row": row, "title": title, "charts": charts, "strata": strata}
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


async def test_the_status_page_shows_each_classifier_in_a_browser(kafka_bootstrap, redis_url, unique_name, tmp_path):
    rng = np.random.default_rng(5)
    scores = 0.5 + rng.random(600) / 2
    truth = {f"i{i}": bool(rng.random() < s) for i, s in enumerate(scores)}
    async with running_service(kafka_bootstrap, redis_url, unique_name, DELTA="0.1", MAX_LABELS_PER_HOUR="5000",
                               CHUNK_SECONDS="30", ALLOWED_LATENESS_SECONDS="0", WINDOWS="2m") as run:
        async with Reviewer(run, unique_name("rev"), lambda req: truth[req["item_id"]]):
            async def estimate():
                now_ms = int(time.time() * 1000)
                for i in range(20):  # a trickle, so that chunks close and the window pools several
                    n = len(truth)
                    await run.send_score(classifier_id="fraud", item_id=f"i{n + i}", score=float(scores[i]),
                                         event_time=now_ms)
                    truth[f"i{n + i}"] = truth[f"i{i}"]
                status, body = await run.get("/v1/classifiers/fraud")
                doc = orjson.loads(body) if status == 200 else None
                return doc if doc and doc["estimate"] is not None and doc["last_closed"] else None

            for i, s in enumerate(scores):
                await run.send_score(classifier_id="fraud", item_id=f"i{i}", score=float(s),
                                     event_time=int(time.time() * 1000))
            await wait_for(estimate, 120, "an estimate and a closed chunk")
            status, body = await run.get("/")
            assert status == 200 and b"<table>" in body
            shot = tmp_path / "status-page.png"
            seen = await asyncio.to_thread(_look, f"http://127.0.0.1:{run.port}", "fraud", shot)
    assert seen["title"] == "fraud" and seen["charts"] >= 1 and seen["strata"] >= 1, seen
    assert seen["row"].count("[") == 3, seen  # the window's, the last closed chunk's and the current interval
    # its status (the chunk may have moved on since the JSON was read: any of the statuses)
    assert any(status in seen["row"] for status in STATUSES), seen
    assert shot.stat().st_size > 10_000
    if os.environ.get("STRATAMETER_TEST_SCREENSHOT"):
        shutil.copy(shot, os.environ["STRATAMETER_TEST_SCREENSHOT"])
