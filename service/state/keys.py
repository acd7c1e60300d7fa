"""Redis key layout.  Every key of one classifier carries the hash tag ``{cid}``,
so a classifier's state lives in one Redis Cluster slot and each atomic script
touches one slot only; service-wide keys share the tag ``{_global}``.

Per classifier ``P:{cid}:...``
  meta                hash   first_seen_ms, scores_total, last_event_ms, owner lease fields
  offsets:scores      hash   partition -> last applied offset of the scores topic
  offsets:labels      hash   partition -> last applied offset of the labels topic
  chunks              zset   chunk id -> chunk id (chunks with data)
  c:<t>:meta          hash   cuts (JSON), cuts_version, provisional ("1" while the chunk has one
                             stratum until RESTRATIFY), opened_ms, round, streak, status, ...
  c:<t>:hist          hash   score bucket -> predicted positives (the sketch)
  c:<t>:N             hash   stratum -> predicted positives
  c:<t>:n / :h        hash   stratum -> labels folded / positives among them
  c:<t>:res:<k>       zset   priority -> item (bottom-k reservoir of stratum k)
  c:<t>:pscores       hash   score (repr) -> predicted positives, only while provisional (exact
                             scores, so RESTRATIFY recomputes N; fewer than 25 x K entries)
  c:<t>:sampled       set    item ids already requested in this chunk
  c:<t>:replace       hash   stratum -> requests to replace (skipped / expired)
  req:<rid>           hash   request: chunk, stratum, item_id, score, deadline_ms, state
  pending             zset   request id -> deadline (ms)
  counters            hash   label outcomes, requests issued/expired, last_label_ms
  hourly              hash   hour (epoch h) -> label requests issued
  lease               string instance id holding the request loop (PX lease)

Service-wide ``P:{_global}:...``
  classifiers         set    classifier ids ever seen
  invalid             hash   "topic|reason" -> count
  offsets:<topic>     hash   partition -> last applied offset for invalid counts
  labels_unknown      hash   count of labels whose request id names no classifier
"""

from __future__ import annotations

GLOBAL_TAG = "_global"


class Keys:
    """Key names for one key prefix."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def classifier(self, cid: str) -> str:
        """The per-classifier key stem ``P:{cid}`` (scripts append suffixes)."""
        return f"{self.prefix}:{{{cid}}}"

    def chunk(self, cid: str, chunk: int) -> str:
        return f"{self.classifier(cid)}:c:{chunk}"

    def request(self, cid: str, rid: str) -> str:
        return f"{self.classifier(cid)}:req:{rid}"

    @property
    def global_stem(self) -> str:
        return f"{self.prefix}:{{{GLOBAL_TAG}}}"

    @property
    def classifiers(self) -> str:
        return f"{self.global_stem}:classifiers"

    @property
    def invalid(self) -> str:
        return f"{self.global_stem}:invalid"

    def global_offsets(self, topic: str) -> str:
        return f"{self.global_stem}:offsets:{topic}"
