"""Send a classifier's scores to stratameter's scores topic, one JSON record per prediction.

    python examples/producer.py                       # 5,000 predictions of a synthetic classifier
    python examples/producer.py --rate 50 -n 6000     # the same as a stream: 50 a second for 2 minutes
    python examples/producer.py --input scores.csv    # your own: item_id,score[,label] (CSV or JSONL)

The synthetic classifier is calibrated (an item with score s is truly positive with probability s), and
each record carries its true label in `context`, where a reviewer reads it (examples/reviewer.py); a
file's `label` column is carried the same way.  Needs aiokafka (a dependency of stratameter).  The
broker and topic come from the service's settings (STRATAMETER_KAFKA_BOOTSTRAP_SERVERS,
STRATAMETER_TOPIC_SCORES) or the options.
"""

import argparse
import asyncio
import csv
import json
import os
import random
import time

from aiokafka import AIOKafkaProducer


def synthetic(n, seed):
    """`n` rows (item_id, score, label): scores from Beta(2, 2), each label true with probability score."""
    rng = random.Random(seed)
    for i in range(n):
        score = round(rng.betavariate(2, 2), 4)
        yield f"item-{seed}-{i}", score, rng.random() < score


def from_file(path):
    """Rows (item_id, score, label or None) of a CSV (with a header) or JSONL file."""
    with open(path, newline="") as f:
        rows = (json.loads(line) for line in f if line.strip()) if path.endswith(".jsonl") else csv.DictReader(f)
        for row in rows:
            label = row.get("label")
            if isinstance(label, str):
                label = {"": None, "1": True, "true": True, "0": False, "false": False}[label.strip().lower()]
            yield str(row["item_id"]), float(row["score"]), None if label is None else bool(label)


async def send(rows, classifier, bootstrap, topic, rate):
    """Send every row keyed by `classifier` (at `rate` records a second, or at once with 0);
    return (records, predicted positives among the labelled, true positives among those)."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20)
    await producer.start()
    sent, positives, true_positives, start = 0, 0, 0, time.monotonic()
    try:
        for item_id, score, label in rows:
            record = {"classifier_id": classifier, "item_id": item_id, "score": score,
                      "event_time": int(time.time() * 1000)}
            if label is not None:
                record["context"] = {"truth": label}
                positives += score >= 0.5  # the service's default STRATAMETER_THRESHOLD
                true_positives += score >= 0.5 and label
            await producer.send(topic, json.dumps(record).encode(), key=classifier.encode())
            sent += 1
            if rate and sent % max(1, int(rate / 10)) == 0:  # pace in steps of a tenth of a second
                await asyncio.sleep(max(0.0, start + sent / rate - time.monotonic()))
    finally:
        await producer.stop()  # sends what is still buffered
    return sent, positives, true_positives


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--input", help="CSV (header item_id,score[,label]) or .jsonl; default: a synthetic classifier")
    p.add_argument("-n", type=int, default=5000, help="synthetic predictions to send (default 5000)")
    p.add_argument("--rate", type=float, default=0, help="records a second (default 0: all at once)")
    p.add_argument("--seed", type=int, default=1, help="seed of the synthetic classifier (default 1)")
    p.add_argument("--classifier", default=os.environ.get("CLASSIFIER_ID", "my-classifier"),
                   help="classifier_id, the record key (default $CLASSIFIER_ID or my-classifier)")
    p.add_argument("--bootstrap", default=os.environ.get("STRATAMETER_KAFKA_BOOTSTRAP_SERVERS", "localhost:9092"),
                   help="Kafka (default $STRATAMETER_KAFKA_BOOTSTRAP_SERVERS or localhost:9092)")
    p.add_argument("--topic", default=os.environ.get("STRATAMETER_TOPIC_SCORES", "stratameter.scores"),
                   help="scores topic (default $STRATAMETER_TOPIC_SCORES or stratameter.scores)")
    args = p.parse_args()
    rows = from_file(args.input) if args.input else synthetic(args.n, args.seed)
    sent, positives, tp = asyncio.run(send(rows, args.classifier, args.bootstrap, args.topic, args.rate))
    print(f"sent {sent} scores of {args.classifier} to {args.topic}")
    if positives:
        print(f"true precision of the labelled predicted positives: {tp / positives:.3f} ({positives} items)")


if __name__ == "__main__":
    main()
