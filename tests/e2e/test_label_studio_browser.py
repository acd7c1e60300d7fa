"""A reviewer in a real browser: headless Chromium (Debian's ``chromium`` and ``chromium-driver``,
driven by Selenium) logs into the real Label Studio, opens a task the bridge made from one of the
service's label requests, clicks a choice and submits; the service's JSON API then counts the label.

The screenshot of the labelling page (taken after the click, before Submit) is saved in the test's
temp dir; with ``STRATAMETER_TEST_SCREENSHOT=<path>`` also there (``docs/label-studio.png`` of docs/how-to/label-studio.md
was taken so: ``STRATAMETER_TEST_SCREENSHOT=docs/label-studio.png pytest tests/e2e/test_label_studio_browser.py``).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
import warnings
from pathlib import Path

import pytest
from hypothesis.errors import HypothesisWarning

from stratameter.api.client import http_json
from tests.harness import running_service, wait_for
from tests.label_studio_harness import running_bridge

pytestmark = pytest.mark.integration

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
#: flags that work on this kind of machine (no GPU, no sandbox as root, no network but localhost)
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1280,860")


def _browser(profile: str):
    for path in (CHROMIUM, CHROMEDRIVER):
        if not os.access(path, os.X_OK):
            pytest.fail(f"{path} is missing: `apt-get install chromium chromium-driver` (CI's .ci/run installs "
                        "them)", pytrace=False)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


def _review_in_browser(url: str, user: str, password: str, project: int, task: int, shot: Path) -> None:
    """Log in, open the task, click "Positive", take the screenshot, Submit, wait until it is saved.
    Label Studio's page re-renders while it loads: each step finds its element again until it holds."""
    from selenium.common.exceptions import (ElementClickInterceptedException, ElementNotInteractableException,
                                            NoSuchElementException, StaleElementReferenceException)
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    def clicked(how: str, what: str, then):
        def step(d):
            d.find_element(how, what).click()
            return then(d)
        return step

    profile = tempfile.mkdtemp(prefix="stratameter-chromium-")
    driver = _browser(profile)
    try:
        wait = WebDriverWait(driver, 60, poll_frequency=0.2, ignored_exceptions=(
            NoSuchElementException, StaleElementReferenceException, ElementClickInterceptedException,
            ElementNotInteractableException))
        driver.get(f"{url}/user/login/")
        wait.until(lambda d: d.find_element(By.NAME, "email")).send_keys(user)
        driver.find_element(By.NAME, "password").send_keys(password)
        driver.find_element(By.CSS_SELECTOR, "button[type=submit], input[type=submit]").click()
        wait.until(lambda d: "/user/login" not in d.current_url)
        driver.get(f"{url}/projects/{project}/data?task={task}")
        wait.until(clicked(By.XPATH, "//label[.//text()[normalize-space()='Positive']]",
                           lambda d: d.find_element(By.CSS_SELECTOR, "input[name='Positive']").is_selected()))
        time.sleep(0.3)  # the radio's animation
        driver.save_screenshot(str(shot))
        wait.until(clicked(By.CSS_SELECTOR, "button[name='submit']", lambda d: True))  # clicked once
        wait.until(lambda d: d.find_element(By.XPATH, "//button[normalize-space()='Update']"))  # saved
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


async def test_a_reviewer_labels_in_the_browser_and_the_service_counts_it(kafka_bootstrap, redis_url, label_studio,
                                                                          unique_name, tmp_path):
    settings = {"STRATA": "2", "ROUND_LABELS_PER_STRATUM": "2", "MAX_LABELS_PER_HOUR": "100000",
                "CHUNK_SECONDS": "240"}
    subjects = ["Your parcel is waiting: confirm the delivery fee", "Team offsite agenda for Thursday",
                "You have won a $500 gift card", "Invoice 2024-118 attached", "URGENT: verify your account now"]
    async with running_service(kafka_bootstrap, redis_url, unique_name, **settings) as svc:
        topics = {"requests": svc.topics["requests"], "labels": svc.topics["labels"]}
        async with running_bridge(kafka_bootstrap, redis_url, label_studio, unique_name, topics=topics,
                                  LABEL_STUDIO_PROJECT="Spam review") as run:
            now_ms = int(time.time() * 1000)
            for i in range(200):
                await svc.send_score(classifier_id="spam-filter", item_id=f"msg-{i:04d}", score=0.5 + (i % 50) / 100,
                                     predicted_positive=True, event_time=now_ms,
                                     context={"subject": subjects[i % len(subjects)],
                                              "from": f"sender{i % 7}@mail.example", "received": "2026-11-25 09:14"})
            await svc.producer.flush()

            async def a_task():
                tasks = await run.project_tasks()
                return tasks[0] if tasks else None

            task = await wait_for(a_task, 60, "a task made from the service's label requests")
            shot = tmp_path / "label-studio.png"
            started = time.monotonic()
            with warnings.catch_warnings():  # selenium imports trio (in the thread), which Hypothesis warns about
                warnings.simplefilter("ignore", HypothesisWarning)
                await asyncio.to_thread(_review_in_browser, label_studio.url, label_studio.user,
                                        label_studio.password, run.project, task["id"], shot)
            browser_s = time.monotonic() - started

            async def counted():
                status, doc = await http_json(svc.port, "/v1/classifiers/spam-filter")
                return doc if status == 200 and doc["labels_by_outcome"]["accepted"] == 1 else None

            doc = await wait_for(counted, 30, "the service to count the label given in the browser")
            assert doc["labels"] == 1
            annotated = [t for t in await run.project_tasks() if t["annotations"]]
            assert [t["id"] for t in annotated] == [task["id"]]
            assert len(annotated[0]["annotations"]) == 1
            result = annotated[0]["annotations"][0]["result"]
            assert result[0]["value"]["choices"] == ["Positive"]
            m = await run.metrics()
            assert m['stratameter_bridge_answers_total{outcome="label_true",via="webhook"}'] == 1
    png = shot.read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 20_000
    print(f"\nbrowser: login, task, click, submit in {browser_s:.1f} s")
    keep = os.environ.get("STRATAMETER_TEST_SCREENSHOT")
    if keep:
        shutil.copyfile(shot, keep)
