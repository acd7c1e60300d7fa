"""Answer stratameter's label requests from a source of truth, as a team of reviewers would.

    python examples/reviewer.py                   # the truth each record carries (examples/producer.py)
    python examples/reviewer.py --skip 0.1        # skip one request in ten (the service asks for another)
    python examples/reviewer.py --truth gold.csv  # your own: item_id,label (CSV or JSONL)

Runs until Ctrl-C.  The true label comes from `--truth` if given, else from the request's
`context.truth`; a request without one is skipped (`"label": null`).  Needs aiokafka (a dependency of
stratameter).  The broker and topics come from the service's settings (STRATAMETER_KAFKA_BOOTSTRAP_SERVERS,
STRATAMETER_TOPIC_LABEL_REQUESTS, STRATAMETER_TOPIC_LABELS) or the options.
"""

import argparse
import asyncio
import csv
import json
import os
import random
from datetime import datetime, timezone

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

TRUE, FALSE = {"1", "true"}, {"0", "false"}


def read_truth(path):
    """{item_id: True / False} from a CSV (header item_id,label) or JSONL file."""
    with open(path, newline="") as f:
        rows = [json.loads(line) for line in f if line.strip()] if path.endswith(".jsonl") else csv.DictReader(f)
        truth = {}
        for row in rows:
            label = str(row["label"]).strip().lower()
            if label in TRUE | FALSE:
                truth[str(row["item_id"])] = label in TRUE
        return truth


def decide(request, truth, skip, rng):
    """The answer to one request: True / False, or None (skipped)."""
    if rng.random() < skip:
        return None
    if truth is not None:
        return truth.get(request["item_id"])
    return (request.get("context") or {}).get("truth")


async def review(args, truth):
    consumer = AIOKafkaConsumer(args.requests, bootstrap_servers=args.bootstrap, group_id=args.group,
                                auto_offset_reset="earliest")  # a new group starts at the first request
    producer = AIOKafkaProducer(bootstrap_servers=args.bootstrap)
    await consumer.start()
    await producer.start()
    rng, answered = random.Random(args.seed), 0
    try:
        async for message in consumer:
            request = json.loads(message.value)
            if args.classifier and request["classifier_id"] != args.classifier:
                continue
            answer = {"request_id": request["request_id"], "label": decide(request, truth, args.skip, rng),
                      "labeler_id": args.labeler, "labeled_at": datetime.now(timezone.utc).isoformat()}
            await producer.send(args.labels, json.dumps(answer).encode(), key=request["classifier_id"].encode())
            answered += 1
            if answered % 100 == 0:
                print(f"answered {answered} requests", flush=True)
    finally:
        await consumer.stop()
        await producer.stop()


def main():
    env = os.environ.get
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--truth", help="CSV (header item_id,label) or .jsonl; default: the request's context.truth")
    p.add_argument("--skip", type=float, default=0.0, help="fraction of requests to skip (default 0)")
    p.add_argument("--classifier", default=env("CLASSIFIER_ID"),
                   help="answer only this classifier's requests (default $CLASSIFIER_ID, or all)")
    p.add_argument("--group", default="example-reviewers", help="consumer group (default example-reviewers)")
    p.add_argument("--labeler", default="example-reviewer", help="labeler_id of the answers")
    p.add_argument("--seed", type=int, default=1, help="seed of the skips (default 1)")
    p.add_argument("--bootstrap", default=env("STRATAMETER_KAFKA_BOOTSTRAP_SERVERS", "localhost:9092"),
                   help="Kafka (default $STRATAMETER_KAFKA_BOOTSTRAP_SERVERS or localhost:9092)")
    p.add_argument("--requests", default=env("STRATAMETER_TOPIC_LABEL_REQUESTS", "stratameter.label-requests"),
                   help="label-request topic (default $STRATAMETER_TOPIC_LABEL_REQUESTS or stratameter.label-requests)")
    p.add_argument("--labels", default=env("STRATAMETER_TOPIC_LABELS", "stratameter.labels"),
                   help="labels topic (default $STRATAMETER_TOPIC_LABELS or stratameter.labels)")
    args = p.parse_args()
    truth = read_truth(args.truth) if args.truth else None
    print(f"answering the requests on {args.requests} (Ctrl-C stops)", flush=True)
    try:
        asyncio.run(review(args, truth))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
