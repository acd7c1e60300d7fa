"""What `stratameter bench` reports of one run (`core.run_bench`): the rates, seconds and Redis
memory it measured, with the repeats' medians and ratios and the CPU per record (`as_json`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class BenchResult:
    records: int
    classifiers: int
    partitions: int
    batch_max_records: int
    service_records_per_s: float
    raw_consume_decode_records_per_s: float
    raw_consume_records_per_s: float
    # the bare decode consumer reading aiokafka's own record objects, as the service's consumer does
    raw_consume_decode_own_records_per_s: float
    service_seconds: float
    service_join_seconds: float
    decode_seconds: float
    raw_seconds: float
    redis_bytes_per_classifier: int
    records_counted: int
    produce_seconds: float
    memory: list[dict] = field(default_factory=list)  # [{"records", "bytes_per_classifier"}], in order
    # with `all_metrics`: the same ingest with STRATAMETER_METRICS=precision,recall,f1,accuracy (both
    # sides of the threshold kept), in the same run
    service_all_metrics_records_per_s: float | None = None
    redis_bytes_per_classifier_all_metrics: int | None = None
    # with `redis_cluster`: the same ingest against a Redis Cluster (STRATAMETER_REDIS_CLUSTER=true), in the same run
    service_cluster_records_per_s: float | None = None
    redis_bytes_per_classifier_cluster: int | None = None
    # with `serve`: the whole service over the ingested classifiers (`serve.serve_bench`), per backend
    serve: dict | None = None
    # with `repeat` > 1: every timed consumer again on the same records, in the same order, that many
    # times; each rate above is then the median over the repeats and each ratio the median of the
    # per-repeat ratios.  Per repeat: {"raw", "decode", "service"[, "all_metrics"][, "cluster"]} records/s
    repeats: list[dict] = field(default_factory=list)
    # per repeat, per service ingest ("service"[, "all_metrics"][, "cluster"]): its CPU seconds
    # (`ingest.service_consume`: {"python", "redis"}), the work behind each rate above
    cpu: list[dict] = field(default_factory=list)

    @property
    def ratio(self) -> float:
        return self._median_ratio("service", "decode", self.service_records_per_s / self.raw_consume_decode_records_per_s)

    def _median_ratio(self, num: str, den: str, single: float) -> float:
        """The median over the repeats of rate `num` / rate `den` (`single` without repeats): a
        ratio of two rates of the same repeat, so a slow moment of the machine hits both."""
        if len(self.repeats) < 2:
            return single
        return float(np.median([r[num] / r[den] for r in self.repeats]))

    def as_json(self) -> dict:
        return {
            "records": self.records,
            "service_records_per_s": round(self.service_records_per_s),
            "raw_consume_decode_records_per_s": round(self.raw_consume_decode_records_per_s),
            "ratio": round(self.ratio, 3),
            "redis_bytes_per_classifier": self.redis_bytes_per_classifier,
            "raw_consume_records_per_s": round(self.raw_consume_records_per_s),
            "raw_consume_decode_own_records_per_s": round(self.raw_consume_decode_own_records_per_s),
            "ratio_vs_own_records_decode": round(self._median_ratio(
                "service", "decode_own", self.service_records_per_s / self.raw_consume_decode_own_records_per_s), 3),
            "records_counted": self.records_counted,
            "classifiers": self.classifiers,
            "partitions": self.partitions,
            "batch_max_records": self.batch_max_records,
            "service_seconds": round(self.service_seconds, 3),
            "decode_seconds": round(self.decode_seconds, 3),
            "raw_seconds": round(self.raw_seconds, 3),
            "service_join_seconds": round(self.service_join_seconds, 3),
            "produce_seconds": round(self.produce_seconds, 3),
            "redis_bytes_per_classifier_at": self.memory,
            **({} if self.service_all_metrics_records_per_s is None else {
                "service_all_metrics_records_per_s": round(self.service_all_metrics_records_per_s),
                "all_metrics_vs_precision": round(self._median_ratio(
                    "all_metrics", "service", self.service_all_metrics_records_per_s / self.service_records_per_s), 3),
                "redis_bytes_per_classifier_all_metrics": self.redis_bytes_per_classifier_all_metrics}),
            **({} if self.service_cluster_records_per_s is None else {
                "service_cluster_records_per_s": round(self.service_cluster_records_per_s),
                "cluster_vs_single": round(self._median_ratio(
                    "cluster", "service", self.service_cluster_records_per_s / self.service_records_per_s), 3),
                "redis_bytes_per_classifier_cluster": self.redis_bytes_per_classifier_cluster}),
            **({} if self.serve is None else {"serve": self.serve}),
            **({"repeats": [{k: round(v) for k, v in r.items()} for r in self.repeats]} if len(self.repeats) > 1 else {}),
            **self._cpu_json(),
        }

    def _cpu_json(self) -> dict:
        """``cpu_us_per_record``: per ingest, the median over the repeats of this process's and
        Redis's CPU microseconds per record; ``all_metrics_vs_precision_cpu``: the median of the
        per-repeat ratios of precision's CPU (both processes) per record to every metric's, the
        cost ratio behind ``all_metrics_vs_precision`` without the machine's scheduling noise."""
        if not self.cpu:
            return {}
        per_record = {
            ingest: {side: (None if any(c[ingest][side] is None for c in self.cpu) else
                            round(float(np.median([c[ingest][side] for c in self.cpu])) * 1e6 / self.records, 3))
                     for side in ("python", "redis")}
            for ingest in self.cpu[0]}
        out: dict = {"cpu_us_per_record": per_record}
        if "all_metrics" in self.cpu[0] and per_record["service"]["redis"] is not None:
            def total(c: dict) -> float:
                return c["python"] + c["redis"]
            out["all_metrics_vs_precision_cpu"] = round(float(np.median(
                [total(c["service"]) / total(c["all_metrics"]) for c in self.cpu])), 3)
        return out
