"""The Label Studio bridge against a real Label Studio (PyPI ``label-studio``, its own virtualenv), the
real Kafka-protocol broker and Redis: label requests become tasks (one per request, through replays,
replicas and a crash mid-creation), annotations come back as labels through the webhook and, with the
webhook blocked, through polling; skips arrive as null, edits are counted and not forwarded, expired
requests lose their tasks, the service folds the answers; bad settings fail the start naming the
variable, malformed webhook bodies get 400 and a counter."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid

import orjson
import pytest

from stratameter.api.client import http_get, http_json
from stratameter.bridge.client import LabelStudio, LabelStudioError
from stratameter.demo.command import PEOPLE_CHUNK_SECONDS as DEMO_PEOPLE_CHUNK_SECONDS
from stratameter.demo.label_studio import TOKEN as LOCAL_TOKEN
from stratameter.bridge.mapping import task_payload
from stratameter.embedded import create_topics, find_free_port
from stratameter.schemas.outbound import decode_label_request, label_request_bytes
from stratameter.schemas.times import rfc3339_to_ms
from tests.harness import read_topic, running_service, wait_for
from tests.label_studio_harness import annotate, project_tasks, running_bridge

pytestmark = pytest.mark.integration

S = "stratameter_bridge_"


def _by_request(tasks: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for t in tasks:
        out.setdefault(t["meta"]["request_id"], []).append(t)
    return out


async def test_requests_become_one_task_each_also_after_replays_and_across_replicas(
        kafka_bootstrap, redis_url, label_studio, unique_name):
    async with running_bridge(kafka_bootstrap, redis_url, label_studio, unique_name, webhook_url=None) as run:
        # a replica that died between creating a task and recording it: the task exists, its claim is stale
        request = decode_label_request(label_request_bytes("clf/orphan", "clf", "item-clf/orphan", 0.5, 0,
                                                           time.time(), time.time() + 600))
        orphan = await run.ls.create_task(run.project, *task_payload(request))
        key = run.bridge.keys.label_studio_request("clf", run.project, "clf/orphan")
        await run.bridge.redis.set(key, "claim dead-replica 1000 1", ex=600)

        await run.send_request("clf/a", context={"text": "free money", "lang": "en", "nested": {"k": [1, 2]}}, times=2)
        await run.send_request("clf/b", times=3)  # no context; published three times
        await run.send_request("clf/c", score=0.31)
        await run.send_request("clf/d")
        await run.send_request("clf/late", expires_in=-5)  # arrives after its deadline: no task
        await run.send_request("clf/orphan")
        await run.producer.send_and_wait(run.topics["requests"], b'{"request_id": "x"}', key=b"clf")

        async def settled():
            m = await run.metrics()
            counted = sum(m[f'{S}requests_total{{outcome="{o}"}}']
                          for o in ("task_created", "task_exists", "expired", "invalid"))
            return m if counted == 10 else None

        m = await wait_for(settled, 60, "the ten label-request records to be handled")
        assert m[f'{S}requests_total{{outcome="task_created"}}'] == 4
        assert m[f'{S}requests_total{{outcome="task_exists"}}'] == 4  # a twice, b thrice, the orphan
        assert m[f'{S}requests_total{{outcome="expired"}}'] == 1
        assert m[f'{S}requests_total{{outcome="invalid"}}'] == 1
        tasks = _by_request(await run.project_tasks())
        assert sorted(tasks) == ["clf/a", "clf/b", "clf/c", "clf/d", "clf/orphan"]
        assert all(len(ts) == 1 for ts in tasks.values())
        assert tasks["clf/orphan"][0]["id"] == orphan
        assert (await run.bridge.redis.get(key)) == f"task {orphan}".encode()

        a = tasks["clf/a"][0]
        assert a["meta"]["classifier_id"] == "clf" and a["meta"]["item_id"] == "item-clf/a"
        assert rfc3339_to_ms(a["meta"]["expires_at"]) > time.time() * 1000
        assert a["data"]["text"] == "free money" and a["data"]["nested"] == {"k": [1, 2]}  # context -> data
        assert a["data"]["stratameter_item"] == {"item_id": "item-clf/a", "text": "free money", "lang": "en",
                                                 "nested": '{"k":[1,2]}'}
        assert "score" not in a["data"] and "score" not in a["data"]["stratameter_item"]  # it anchors judgement
        assert tasks["clf/b"][0]["data"]["stratameter_item"] == {"item_id": "item-clf/b"}  # no context: the item id
        assert "clf" in tasks["clf/b"][0]["data"]["stratameter_question"]

        # two more replicas replay the whole topic at once (fresh consumer groups), same Redis and project
        same = {"REDIS_KEY_PREFIX": run.bridge.settings.redis_key_prefix, "LABEL_STUDIO_PROJECT": str(run.project)}
        async with running_bridge(kafka_bootstrap, redis_url, label_studio, unique_name, topics=run.topics,
                                  webhook_url=None, **same) as r2, \
                running_bridge(kafka_bootstrap, redis_url, label_studio, unique_name, topics=run.topics,
                               webhook_url=None, **same) as r3:
            for replica in (r2, r3):
                async def replayed(replica=replica):
                    m = await replica.metrics()
                    return m[f'{S}requests_total{{outcome="task_exists"}}'] == 8 or None

                await wait_for(replayed, 60, "a replica to replay the topic")
                m = await replica.metrics()
                assert m[f'{S}requests_total{{outcome="task_created"}}'] == 0
        tasks = _by_request(await run.project_tasks())
        assert sorted(tasks) == ["clf/a", "clf/b", "clf/c", "clf/d", "clf/orphan"]
        assert all(len(ts) == 1 for ts in tasks.values())


async def test_answers_come_back_through_the_webhook(kafka_bootstrap, redis_url, label_studio, unique_name):
    async with running_bridge(kafka_bootstrap, redis_url, label_studio, unique_name,
                              LABEL_STUDIO_POLL_SECONDS="3600") as run:
        rids = [f"clf/w{i}" for i in range(5)]
        for rid in rids:
            await run.send_request(rid)
        open_key = run.bridge.keys.label_studio(run.project, "open")

        async def five_open():
            return await run.bridge.redis.zcard(open_key) == 5

        await wait_for(five_open, 60, "five tasks")
        task = {rid: ts[0] for rid, ts in _by_request(await run.project_tasks()).items()}
        started = time.monotonic()
        made = {rids[0]: await annotate(run.ls, task[rids[0]]["id"], "Positive"),
                rids[1]: await annotate(run.ls, task[rids[1]]["id"], "Negative"),
                rids[2]: await annotate(run.ls, task[rids[2]]["id"], "Unsure"),
                rids[3]: await annotate(run.ls, task[rids[3]]["id"], None, cancelled=True)}  # Skip
        labels = await read_topic(kafka_bootstrap, run.topics["labels"], unique_name("read"), expect=4, timeout=30)
        seconds = time.monotonic() - started
        assert {x["request_id"]: x["label"] for x in labels} == {rids[0]: True, rids[1]: False, rids[2]: None,
                                                                 rids[3]: None}
        for x in labels:
            assert x["labeler_id"] == label_studio.user
            assert rfc3339_to_ms(x["labeled_at"]) == rfc3339_to_ms(made[x["request_id"]]["created_at"])
        m = await run.metrics()
        assert [m[f'{S}answers_total{{outcome="label_{o}",via="webhook"}}'] for o in ("true", "false", "null")] \
            == [1, 1, 2]
        assert m[f'{S}answer_delay_seconds_count{{via="webhook"}}'] == 4
        assert m[f'{S}answer_delay_seconds_count{{via="poll"}}'] == 0
        mean = m[S + 'answer_delay_seconds_sum{via="webhook"}'] / 4
        print(f"\n4 annotations to 4 labels on the topic through the webhook in {seconds:.2f} s; mean delay "
              f"annotation -> produced {mean:.3f} s")
        assert await run.bridge.redis.zcard(open_key) == 1  # w4 still waits for a reviewer

        # an edit (ANNOTATION_UPDATED) is counted, never forwarded: the service keeps the first answer
        await run.ls.call("PATCH", f"/api/annotations/{made[rids[0]]['id']}", json={"result": [
            {"from_name": "label", "to_name": "item", "type": "choices", "value": {"choices": ["Negative"]}}]})
        # a second annotation of an answered task is not forwarded either
        await annotate(run.ls, task[rids[1]]["id"], "Positive")

        async def counted():
            m = await run.metrics()
            return (m[f'{S}answers_total{{outcome="updated",via="webhook"}}'] == 1
                    and m[f'{S}answers_total{{outcome="already_forwarded",via="webhook"}}'] == 1)

        await wait_for(counted, 20, "the edit and the second annotation to be counted")
        again = await read_topic(kafka_bootstrap, run.topics["labels"], unique_name("read"), timeout=10)
        assert len(again) == 4


async def test_answers_come_back_by_polling_when_the_webhook_is_blocked(kafka_bootstrap, redis_url, label_studio,
                                                                        unique_name):
    nowhere = f"http://127.0.0.1:{find_free_port()}/webhook"  # Label Studio's webhook calls fail
    async with running_bridge(kafka_bootstrap, redis_url, label_studio, unique_name, webhook_url=nowhere,
                              LABEL_STUDIO_POLL_SECONDS="1") as run:
        for rid in ("clf/p0", "clf/p1", "clf/p2"):
            await run.send_request(rid)

        async def three():
            tasks = await run.project_tasks()
            return tasks if len(tasks) == 3 else None

        task = {t["meta"]["request_id"]: t for t in await wait_for(three, 60, "three tasks")}
        await annotate(run.ls, task["clf/p0"]["id"], "Negative")
        await annotate(run.ls, task["clf/p1"]["id"], None, cancelled=True)
        labels = await read_topic(kafka_bootstrap, run.topics["labels"], unique_name("read"), expect=2, timeout=30)
        assert {x["request_id"]: x["label"] for x in labels} == {"clf/p0": False, "clf/p1": None}
        assert all(x["labeler_id"] == label_studio.user for x in labels)
        m = await run.metrics()
        assert m[f'{S}answers_total{{outcome="label_false",via="poll"}}'] == 1
        assert m[f'{S}answers_total{{outcome="label_null",via="poll"}}'] == 1
        assert m[f'{S}answer_delay_seconds_count{{via="webhook"}}'] == 0
        assert 0 <= m[f"{S}poll_lag_seconds"] < 5
        assert m[f"{S}open_tasks"] == 1
        await asyncio.sleep(2.5)  # more polls: nothing is forwarded twice
        assert len(await read_topic(kafka_bootstrap, run.topics["labels"], unique_name("read"), timeout=10)) == 2


async def test_expired_requests_lose_their_tasks(kafka_bootstrap, redis_url, label_studio, unique_name):
    async with running_bridge(kafka_bootstrap, redis_url, label_studio, unique_name,
                              LABEL_STUDIO_POLL_SECONDS="1") as run:
        await run.send_request("clf/e-unanswered", expires_in=6)
        await run.send_request("clf/e-answered", expires_in=6)

        async def two():
            tasks = await run.project_tasks()
            return tasks if len(tasks) == 2 else None

        task = {t["meta"]["request_id"]: t for t in await wait_for(two, 30, "two tasks")}
        await annotate(run.ls, task["clf/e-answered"]["id"], "Positive")

        async def removed():
            m = await run.metrics()
            return m[f'{S}tasks_removed_total{{reason="expired"}}'] == 1

        await wait_for(removed, 30, "the unanswered task to be removed after its deadline")
        assert await run.ls.task(task["clf/e-unanswered"]["id"]) is None
        assert await run.ls.task(task["clf/e-answered"]["id"]) is not None  # the reviewer's work stays
        assert await run.bridge.redis.zcard(run.bridge.keys.label_studio(run.project, "open")) == 0
        labels = await read_topic(kafka_bootstrap, run.topics["labels"], unique_name("read"), expect=1, timeout=20)
        assert [(x["request_id"], x["label"]) for x in labels] == [("clf/e-answered", True)]


async def test_malformed_webhook_bodies_get_400_and_a_counter(kafka_bootstrap, redis_url, label_studio,
                                                              unique_name):
    async with running_bridge(kafka_bootstrap, redis_url, label_studio, unique_name) as run:
        async def post(body: bytes, headers: str | None = None) -> tuple[int, dict]:
            reader, writer = await asyncio.open_connection("127.0.0.1", run.port)
            head = headers if headers is not None else f"Content-Length: {len(body)}\r\n"
            writer.write(f"POST /webhook HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{head}\r\n"
                         .encode() + body)
            await writer.drain()
            raw = await reader.read()
            writer.close()
            head_, _, payload = raw.partition(b"\r\n\r\n")
            return int(head_.split(b" ")[1]), orjson.loads(payload)

        cases = {"invalid_json": b"{not json", "not_object": b"[1, 2]", "no_action": b'{"annotation": {}}',
                 "bad_annotation": b'{"action": "ANNOTATION_CREATED", "annotation": {"id": 1}}'}
        for reason, body in cases.items():
            status, doc = await post(body)
            assert (status, doc["reason"]) == (400, reason), doc
        assert (await post(b"x", "Transfer-Encoding: chunked\r\n"))[0] == 400
        assert (await post(b"", f"Content-Length: {5 << 20}\r\n"))[0] == 400
        # well-formed but forged or foreign: 200, and no label (each task is read back from Label Studio)
        forged = {"action": "ANNOTATION_CREATED", "annotation": {"id": 99, "task": 987654321, "result": [
            {"type": "choices", "value": {"choices": ["Positive"]}}]}}
        assert (await post(orjson.dumps(forged)))[0] == 200
        other = await run.ls.create_project("other-project", "<View><Text name='t' value='$t'/></View>", "")
        foreign = await run.ls.create_task(other["id"], {"t": "x"}, {"request_id": "clf/foreign", "classifier_id": "clf"})
        await annotate(run.ls, foreign, None, cancelled=True)
        assert (await post(orjson.dumps({"action": "ANNOTATION_CREATED",
                                         "annotation": {"id": 1, "task": foreign}})))[0] == 200
        assert (await post(orjson.dumps({"action": "PROJECT_UPDATED"})))[0] == 200  # not ours to act on

        async def foreign_counted():
            m = await run.metrics()
            return m[f'{S}answers_total{{outcome="not_ours",via="webhook"}}'] == 1

        await wait_for(foreign_counted, 10, "the foreign task to be counted")
        m = await run.metrics()
        for reason in cases:
            assert m[f'{S}webhook_errors_total{{reason="{reason}"}}'] == 1
        assert m[f'{S}webhook_errors_total{{reason="bad_request"}}'] == 1
        assert m[f'{S}webhook_errors_total{{reason="too_large"}}'] == 1
        assert (await http_get(run.port, "/healthz"))[0] == 200
        assert (await http_json(run.port, "/readyz")) == (200, {"ready": True, "kafka": True, "redis": True,
                                                                "label_studio": True})
        assert len(await read_topic(kafka_bootstrap, run.topics["labels"], unique_name("read"), timeout=3)) == 0
        await run.ls.delete_project(other["id"])


async def test_the_service_folds_the_answers_and_the_estimate_moves(kafka_bootstrap, redis_url, label_studio,
                                                                    unique_name):
    # 4-minute chunks: the service takes the arrivals as stopped after 2 s of silence (not 30 s) and plans its rounds
    settings = {"STRATA": "2", "ROUND_LABELS_PER_STRATUM": "2", "MAX_LABELS_PER_HOUR": "100000", "DELTA": "0.3",
                "CHUNK_SECONDS": "240"}
    async with running_service(kafka_bootstrap, redis_url, unique_name, **settings) as svc:
        topics = {"requests": svc.topics["requests"], "labels": svc.topics["labels"]}
        async with running_bridge(kafka_bootstrap, redis_url, label_studio, unique_name, topics=topics) as run:
            now_ms = int(time.time() * 1000)
            truth = {}
            for i in range(400):
                truth[f"msg-{i}"] = i % 3 != 0
                await svc.send_score(classifier_id="spam", item_id=f"msg-{i}", score=0.5 + (i % 50) / 100,
                                     predicted_positive=True, event_time=now_ms, context={"subject": f"offer {i}"})
            await svc.producer.flush()

            async def requested():
                tasks = await run.project_tasks()
                return tasks if len(tasks) >= 4 else None

            tasks = await wait_for(requested, 60, "the service's first label requests to become tasks")
            before = (await http_json(svc.port, "/v1/classifiers/spam"))[1]
            assert before["labels"] == 0 and before["estimate"] is None
            for t in tasks:
                await annotate(run.ls, t["id"], "Positive" if truth[t["meta"]["item_id"]] else "Negative")

            async def folded():
                status, doc = await http_json(svc.port, "/v1/classifiers/spam")
                return doc if status == 200 and doc["labels"] >= len(tasks) else None

            doc = await wait_for(folded, 30, "the service to fold the reviewers' answers")
            assert doc["labels_by_outcome"]["accepted"] == len(tasks)
            assert doc["estimate"] is not None and 0 <= doc["ci_lower"] <= doc["estimate"] <= doc["ci_upper"] <= 1


def _free_ports(n: int) -> list[int]:
    ports: set[int] = set()
    while len(ports) < n:
        ports.add(find_free_port())
    return sorted(ports)


def _bridge_cli(env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith("STRATAMETER_")}
    full.update({f"STRATAMETER_{k}": v for k, v in env.items()})
    return subprocess.run([sys.executable, "-m", "stratameter.cli", "bridge", "label-studio"], env=full,
                          capture_output=True, text=True, timeout=timeout)


async def test_start_fails_clearly_on_a_bad_url_token_project_or_choices(label_studio, unique_name, tmp_path):
    ls = LabelStudio(label_studio.url, label_studio.token)
    project = await ls.create_project("spam-or-ham", "<View><Text name='t' value='$t'/><Choices "
                                      "name='c' toName='t'><Choice value='Spam'/><Choice value='Ham'/></Choices>"
                                      "</View>", "")
    await ls.aclose()
    base = {"LABEL_STUDIO_URL": label_studio.url, "LABEL_STUDIO_TOKEN": label_studio.token,
            "BRIDGE_HTTP_HOST": "127.0.0.1", "KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1",
            "REDIS_URL": "redis://127.0.0.1:1/0"}
    secret = "wrong-token-0123456789"
    token_file = tmp_path / "token"
    token_file.write_text(secret + "\n")
    cases = [
        ({"LABEL_STUDIO_URL": f"http://127.0.0.1:{find_free_port()}"}, 1, "cannot reach Label Studio",
         "STRATAMETER_LABEL_STUDIO_URL"),
        ({"LABEL_STUDIO_TOKEN": secret}, 1, "refused the token", "STRATAMETER_LABEL_STUDIO_TOKEN"),
        ({"LABEL_STUDIO_TOKEN": "", "LABEL_STUDIO_TOKEN_FILE": str(token_file)}, 1, "refused the token",
         "STRATAMETER_LABEL_STUDIO_TOKEN"),
        ({"LABEL_STUDIO_TOKEN": ""}, 2, "configuration error", "STRATAMETER_LABEL_STUDIO_TOKEN: required"),
        ({"LABEL_STUDIO_URL": "localhost:8080"}, 2, "configuration error", "STRATAMETER_LABEL_STUDIO_URL"),
        ({"LABEL_STUDIO_PROJECT": "999999"}, 1, "has no project with id 999999", "STRATAMETER_LABEL_STUDIO_PROJECT"),
        ({"LABEL_STUDIO_PROJECT": str(project["id"])}, 1, "no choice 'Positive', 'Negative', 'Unsure'",
         "STRATAMETER_LABEL_STUDIO_CHOICES"),
    ]
    runs = await asyncio.gather(*(asyncio.to_thread(_bridge_cli, {**base, "BRIDGE_HTTP_PORT": str(port), **env})
                                  for port, (env, *_) in zip(_free_ports(len(cases)), cases)))
    for (env, code, message, variable), res in zip(cases, runs):
        out = res.stdout + res.stderr
        assert res.returncode == code, (env, out)
        assert message in out and variable in out, (env, out)
        assert secret not in out


async def test_demo_with_label_studio_reviewers(tmp_path):
    """`stratameter demo --reviewers label-studio` as a person runs it: the demo starts its own Label
    Studio and bridge, prints the URL and login; the tasks that appear there are labelled (through the
    API here, as the browser test does through the page), the service folds them, and Ctrl-C stops
    every process the demo started."""
    from tests.e2e.test_demo import _alive, _env, _tree

    marker = uuid.uuid4().hex
    err_path = tmp_path / "demo.err"
    with open(err_path, "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "stratameter.cli", "demo", "--reviewers", "label-studio",
                                 "--json", "--rate", "20"], env=_env(marker), stdout=subprocess.PIPE, stderr=err,
                                stdin=subprocess.DEVNULL)
    seen: dict = {}
    try:
        async def printed():
            text = err_path.read_text(errors="replace")
            ls = re.search(r"Label Studio: (http://127\.0\.0\.1:\d+)\s+login (\S+) / (\S+)", text)
            api = re.search(r"metrics: http://127\.0\.0\.1:(\d+)/metrics", text)
            assert proc.poll() is None, text
            return (ls, api) if ls and api else None

        ls_match, api_match = await wait_for(printed, 120, "the demo to print Label Studio's URL and login")
        url, user = ls_match.group(1), ls_match.group(2)
        assert user == "reviewer@example.com"
        seen.update(_tree(marker, proc.pid))
        ls = LabelStudio(url, LOCAL_TOKEN)
        try:
            async def tasks():
                projects = await ls.projects_titled("stratameter demo")
                found = await project_tasks(ls, projects[0]["id"]) if projects else []
                return found if len(found) >= 6 else None

            todo = (await wait_for(tasks, 60, "the demo's label requests to appear as tasks"))[:6]
            chunk_of_tasks = int(time.time()) // DEMO_PEOPLE_CHUNK_SECONDS
            for i, t in enumerate(todo):
                await annotate(ls, t["id"], "Positive" if i % 2 else "Negative")
        finally:
            await ls.aclose()

        async def folded():
            total = 0
            for cid in {t["meta"]["classifier_id"] for t in todo}:
                status, doc = await http_json(int(api_match.group(1)), f"/v1/classifiers/{cid}")
                total += doc["labels_by_outcome"]["accepted"] if status == 200 else 0
            return total >= len(todo)

        await wait_for(folded, 30, "the service to fold the six answers")
        seen.update(_tree(marker, proc.pid))
        proc.send_signal(signal.SIGINT)
        out, _ = await asyncio.to_thread(proc.communicate, timeout=60)
        assert proc.returncode == 0, err_path.read_text()
        summary = json.loads(out.decode().strip().splitlines()[-1])
        assert {row["classifier"] for row in summary["classifiers"]} >= {t["meta"]["classifier_id"] for t in todo}
        # the summary reports each classifier's newest chunk: the answers' chunk unless a new one began
        if int(time.time()) // DEMO_PEOPLE_CHUNK_SECONDS == chunk_of_tasks:
            assert sum(row["labels"] for row in summary["classifiers"]) >= 1
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        left = _alive(seen, marker)
        for pid, _ in left:  # a demo killed mid-shutdown leaves its children: never to the next tests
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert any("label-studio" in cmd for cmd in seen.values()) and any("bridge" in cmd for cmd in seen.values())
    assert not left, left


async def test_a_personal_access_token_is_exchanged_and_renewed(label_studio):
    """Label Studio's default token since 1.18 is a personal access token (a JWT refresh token): the
    client trades it for an access token and trades again when that one is refused."""
    legacy = LabelStudio(label_studio.url, label_studio.token)
    try:
        pat = (await legacy.call("POST", "/api/token/", json={}))["token"]
    finally:
        await legacy.aclose()
    ls = LabelStudio(label_studio.url, pat)
    try:
        assert (await ls.whoami())["email"] == label_studio.user
        ls._access = "expired.access.token"
        assert (await ls.whoami())["email"] == label_studio.user
    finally:
        await ls.aclose()
    wrong = LabelStudio(label_studio.url, pat[:-6] + "AAAAAA")
    try:
        with pytest.raises(LabelStudioError) as exc:
            await wrong.whoami()
        assert exc.value.status == 401
    finally:
        await wrong.aclose()


async def test_the_bridge_process_serves_and_stops_cleanly_on_sigterm(kafka_bootstrap, redis_url, label_studio,
                                                                     unique_name, tmp_path):
    """`stratameter bridge label-studio` as deployed: the token from a file, ready, a request becomes a
    task, SIGTERM ends it with exit 0 (consumer group left), and the token is in no log line."""
    topics = {"requests": unique_name("requests"), "labels": unique_name("labels")}
    await create_topics(kafka_bootstrap, list(topics.values()), partitions=2)
    token_file = tmp_path / "token"
    token_file.write_text(label_studio.token + "\n")
    port, title = find_free_port(), f"sigterm-{uuid.uuid4().hex[:8]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("STRATAMETER_")}
    env.update({f"STRATAMETER_{k}": v for k, v in {
        "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap, "KAFKA_SESSION_TIMEOUT_MS": "6000", "REDIS_URL": redis_url,
        "REDIS_KEY_PREFIX": unique_name("br"), "TOPIC_LABEL_REQUESTS": topics["requests"],
        "TOPIC_LABELS": topics["labels"], "BRIDGE_CONSUMER_GROUP": unique_name("bridge"),
        "BRIDGE_HTTP_HOST": "127.0.0.1", "BRIDGE_HTTP_PORT": str(port), "LABEL_STUDIO_URL": label_studio.url,
        "LABEL_STUDIO_TOKEN_FILE": str(token_file), "LABEL_STUDIO_PROJECT": title,
        "LABEL_STUDIO_WEBHOOK_URL": f"http://127.0.0.1:{port}/webhook", "LOG_LEVEL": "DEBUG"}.items()})
    log_path = tmp_path / "bridge.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "stratameter.cli", "bridge", "label-studio"], env=env,
                                stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    ls = LabelStudio(label_studio.url, label_studio.token)
    try:
        async def ready():
            assert proc.poll() is None, log_path.read_text()
            return (await http_json(port, "/readyz"))[0] == 200

        await wait_for(ready, 60, "the bridge to be ready")
        now = time.time()
        from aiokafka import AIOKafkaProducer

        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
        await producer.start()
        await producer.send_and_wait(topics["requests"], label_request_bytes("clf/sig", "clf", "item-1", 0.5, 0, now,
                                                                             now + 600), key=b"clf")
        await producer.stop()
        project = (await ls.projects_titled(title))[0]["id"]

        async def tasked():
            return len(await project_tasks(ls, project)) == 1

        await wait_for(tasked, 30, "the request's task")
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(proc.wait, 20)
    finally:
        await ls.aclose()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log_path.read_text()
    assert code == 0, text
    assert '"msg":"stopped"' in text and label_studio.token not in text
