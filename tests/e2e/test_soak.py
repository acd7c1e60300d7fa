"""`stratameter soak`, shortened: the service as a subprocess, fed at a steady rate with every metric
enabled (so both sides of the threshold keep state and get label requests), through a kill -9, a
broker outage and a Redis outage, with every count checked three ways (the API, the strata of every
chunk, what was sent and answered).  Chunks of 5 s with a retention of 3 make the run open, close and
purge some fifteen chunks a side, as a service does over days, through the same faults."""

from __future__ import annotations

import asyncio
import subprocess
import sys

from stratameter.soak.command import soak


def test_soak_counts_every_record_and_label_once_through_each_fault_and_purge_with_every_metric():
    # faults at 15 s (kill -9), 35 s (broker), 55 s (Redis), each 5 s long
    report = asyncio.run(soak(75, 200, 3, 20, 5, quiet=True, metrics="precision,recall,f1,accuracy",
                              chunk_seconds=5, chunk_retention=3))
    assert report["fault_kinds"] == ["kafka outage", "kill-9 service", "redis outage"], report
    assert report["records_in"] >= 14_000, report
    assert report["records_counted"] == report["strata_items"] == report["records_in"], report
    assert report["labels_folded"] == report["strata_labels"] == report["labels_answered"] > 0, report
    # about half the records are predicted negatives (scores uniform, threshold 0.5), and they get labels
    assert 0.4 < report["strata_items_negative"] / report["records_in"] < 0.6, report
    assert report["strata_labels_negative"] > 0, report
    # 3 classifiers x 2 sides x 15-16 chunks, all but the newest 3 of each purged of their reservoirs
    assert 6 * 15 <= report["chunks"] <= 6 * 17, report
    assert report["chunks_purged"] >= report["chunks"] - 6 * 4, report
    assert len(report["rss_mib_by_minute"]) == 2 and min(report["rss_mib_by_minute"]) > 0, report
    assert report["max_rss_mib"] == max(report["rss_mib_by_minute"]), report
    assert report["exact"]


def test_soak_refuses_an_unknown_metric_naming_the_option():
    run = subprocess.run([sys.executable, "-m", "stratameter.cli", "soak", "--metrics", "precision,recal"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2
    assert "--metrics" in run.stderr and "unknown metric 'recal'" in run.stderr
