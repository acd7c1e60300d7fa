"""Redis key layout: every key name the service uses is built here, and only here.

Every key of one classifier carries the hash tag ``{cid}``, so a classifier's state lives
in one Redis Cluster slot; service-wide keys share the tag ``{_global}``.  The Lua scripts
(``lua/*.lua``) build no key: the store passes every key a script touches in KEYS, all
in one slot (tests/integration/test_state_keys.py checks both against a real Redis).

Per classifier ``<prefix>:{cid}:...``
  meta                hash   first_seen_ms, scores_total, last_event_ms, unpaired_through_ms (the
                             latest event time counted while the metrics needed no predicted
                             negatives) (INGEST)
  offsets:scores      hash   scores partition -> last applied offset (INGEST's guard); of a topic
                             other than the one the state was first written from, "<topic>:<partition>"
                             (`app.batch.BatchHandler.offset_field`)
  offsets:labels      hash   labels partition -> last applied offset (LABEL's guard), the same way
  chunks              zset   chunk id -> chunk id (chunks with data)
  c:<t>:meta          hash   cuts (JSON), cuts_version, provisional ("1" while the chunk has one
                             stratum until RESTRATIFY, or FREEZE once closed), opened_ms, round, evaluated_round,
                             streak, status (OPEN_CHUNK, EVALUATE_ROUND, the request loop),
                             res_size (RESERVOIR_SIZE when the chunk opened: its reservoirs
                             never grow past it, OPEN_CHUNK), status_closed ("1" once the loop judged the status of the closed
                             chunk);
                             min, max (score range, repr), first_ms, last_ms (wall-clock time
                             of the first and last arrival) (INGEST); tau (JSON, per stratum
                             the inclusion threshold of the last requests, ISSUE)
  c:<t>:bins          string the score histogram of the predicted positives (the sketch):
                             `stats.sketch.BINS` unsigned 32-bit big-endian counters, bucket b at
                             byte 4 ((b + 2048) mod 4096), saturating (INGEST: runs of counters
                             by GETRANGE/SETRANGE, else BITFIELD INCRBY; `ingest.bins`)
  c:<t>:hist          hash   score bucket -> predicted positives: the histogram as versions before
                             `bins` kept it; read (added to `bins`) and deleted, never written
  c:<t>:N             hash   stratum -> predicted positives
  c:<t>:n / c:<t>:h   hash   stratum -> labels folded / positives among them (LABEL)
  c:<t>:res:<k>       zset   priority -> member {"i": item, "s": score, "x": context} (bottom-k
                             reservoir of stratum k)
  c:<t>:pscores       hash   score (repr) -> predicted positives, only while provisional (exact
                             scores, so RESTRATIFY recomputes N; fewer than 25 x K entries)
  c:<t>:sampled       set    item ids already requested in this chunk (ISSUE)
  c:<t>:replace       hash   stratum -> requests to replace (skipped by LABEL, expired by EXPIRE)
  c:<t>:labelled      hash   request id -> "<stratum> <label> <score>" of each label folded (LABEL):
                             the difference estimator's labelled items (`labels.calibrated`),
                             at most the chunk's labels; dropped with the reservoirs
  req:<rid>           hash   request: chunk, stratum, item (the reservoir member), score, round,
                             requested_ms, deadline_ms, state (new, pending, joined, answered,
                             skipped, expired); joins (a joined request: the request it joined);
                             once answered label, answered_ms, labeler.  Expires
                             (PEXPIREAT) the request retention after its deadline
  pending             zset   request id -> deadline (ms), requests not yet answered or expired
  counters            hash   labels_accepted, labels_skipped, labels_duplicate, labels_expired,
                             labels_unknown, labels_shared, last_label_ms, requests_total,
                             requests_joined, requests_expired,
                             status_changes (EVALUATE_ROUND, SET_STATUS: a closed chunk's status changed)
  hourly              hash   hour (epoch h) -> label requests issued (published; joined ones cost nothing)
  joins               hash   joined request id -> the request id it joined, while it awaits that
                             answer (ISSUE; `requests.shared_items` deletes an entry once resolved)
  lease               string instance id holding the request loop (PX lease, fences ISSUE)

The predicted negatives of a classifier whose metrics need them (recall, F1, accuracy) are
kept as a state of their own, state id ``<cid>~negatives`` (`negatives_of`): the same keys as
above under ``<prefix>:{cid}:neg:...`` (the classifier's slot; its own offsets, chunks,
strata, reservoirs and requests; its request ids start ``<cid>~negatives/``), except the
lease, which is the classifier's (one owner, one fence for both sides).  ``~`` is not a
classifier-id character, so no classifier can collide with it, and it is never in
``classifiers``.

Service-wide ``<prefix>:{_global}:...``
  classifiers         set    classifier ids ever seen
  instances           zset   instance id -> last heartbeat (ms)
  invalid             hash   "topic|reason" -> rejected records
  labels_unknown      hash   "unknown" -> labels whose request id names no classifier
  settings            hash   chunk_seconds: the chunk length the state was written with (chunk ids
                             count chunks of it; the service refuses to start with another,
                             `app.probes.check_chunk_seconds`); started_ms: when the state began;
                             lost_through_ms: the latest event time of a record counted in a
                             state Redis lost (`app.state_watch`); topic_scores, topic_labels: the
                             topics the offsets were first written from (`Registry.noted_topics`)
  applied             hash   "<topic>:<partition>" -> the next offset to read: every record before it
                             changed the state (raised before the offsets are committed to Kafka,
                             `app.checkpoint`; a Redis rolled back is replayed from it, `app.state_watch`)
  acknowledged:<sid>  hash   "scores:<partition>" / "labels:<partition>" (the name the state keeps the
                             partition's offset under) -> the last offset the state's guard acknowledged
                             applied (copied at each commit, `app.checkpoint`): in a Redis Cluster a
                             state's node can go back while this one did not, and the start that finds
                             the state below it replays the partition from the state's offset
                             (`app.state_watch`); deleted with the state (FORGET)
  probe:<instance>    string the readiness probe's write, the service's and the bridge's (PX 6 s;
                             refused by a full Redis; `app.probes.probe_redis`)
  offsets:<scope>     hash   partition -> last applied offset of the counts of `scope` (a topic
                             name for `invalid`, "labels-unknown" for `labels_unknown`)

Per review group ``<prefix>:{<group>~group}:...`` (a shared label budget, issue 52; ``~`` is not a
classifier-id character, so the slot is the group's own, docs/concepts/shared-budget.md):
  granted:<hour>      string labels granted to the group's classifiers in clock hour <hour> (epoch h)
                             (GRANT; expires two hours after its last grant)
  forecasts           hash   "<cid>/<chunk>" -> JSON of the chunk's forecast (`chunks.group_plan`,
                             written by its request loop each step; fields older than
                             `chunks.group_plan.FORECAST_TTL_SECONDS` are ignored and deleted)
  item:<item_id>      string in a group that shares items, the first request of the item any
                             member asked for (CLAIM; expires at that request's deadline): a member
                             wanting the item later joins it (`requests.shared_items`)

The Label Studio bridge (``stratameter bridge label-studio``, ``service/bridge/``), per Label Studio
project id ``<p>``; no script touches them, each call names one key:
  {cid}:ls:<p>:<rid>  string the task of label request `rid`: "claim <instance> <ms> <n>" while a
                             replica creates it, then "task <id>", then "answered <id> <annotation>"
                             (`bridge.claims`: parsed into a typed state, the transitions);
                             expires a day after the request's expires_at (at most 31 days from its
                             arrival), so a replayed request never makes a second task
  {_global}:ls:<p>:open     zset   task id -> the request's expires_at (ms, at most 31 days ahead):
                             tasks awaiting an answer (polled; removed when answered or expired)
  {_global}:ls:<p>:poller   string the replica polling Label Studio this interval (PX lease)
  {_global}:ls:<p>:polled   string when a poll last completed (ms; the bridge's poll lag)
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

GLOBAL_TAG = "_global"
#: The largest STRATAMETER_STRATA allowed: a chunk has at most this many reservoirs (``c:<t>:res:<k>``),
#: each of which is deleted when the chunk is purged or forgotten.
MAX_STRATA = 20
#: The hash-tag suffix of a review group's keys (``{<group>~group}``).
GROUP_SUFFIX = "~group"
#: The state id of a classifier's predicted negatives is the classifier id plus this.
NEGATIVES_SUFFIX = "~negatives"


def negatives_of(cid: str) -> str:
    """The state id holding classifier `cid`'s predicted negatives (see the table above)."""
    return cid + NEGATIVES_SUFFIX


def first_negative_stratum(strata: int, positive_strata: int = 0) -> int:
    """The public id (label requests, the API) of a chunk's first predicted-negative stratum: the
    negatives' strata are numbered after the positives', from the configured STRATA (`strata`),
    or from the chunk's own count of positive strata where that is larger (STRATA lowered while
    the chunk was open), so the two sides' ids never overlap."""
    return max(strata, positive_strata)


def owner_of(state_id: str) -> tuple[str, bool]:
    """``(classifier id, is the negative side)`` of a state id."""
    if state_id.endswith(NEGATIVES_SUFFIX):
        return state_id[: -len(NEGATIVES_SUFFIX)], True
    return state_id, False


#: The offset scope of the service-wide count of labels naming no classifier.
UNKNOWN_LABELS_SCOPE = "labels-unknown"


def ingest_chunks(payload: dict) -> list[tuple[str, list[int]]]:
    """The chunks of an INGEST payload (`ingest.aggregate.build_payload`), each with the strata
    whose reservoirs the payload adds to: what `Keys.ingest_keys` needs."""
    return [(c["t"], [r[0] for r in c["res"]]) for c in payload["chunks"]]


def _classifier_key(suffix: str, doc: str | None = None):
    """A `Keys` method: the classifier's key ``<prefix>:{cid}:<suffix>`` (see the table above)."""
    def key(self: "Keys", cid: str) -> str:
        return f"{self.classifier(cid)}:{suffix}"
    key.__doc__ = doc or f"``<prefix>:{{cid}}:{suffix}``"
    return key


def _chunk_key(suffix: str, doc: str | None = None):
    """A `Keys` method: chunk `t`'s key ``<prefix>:{cid}:c:<t>:<suffix>`` (see the table above)."""
    def key(self: "Keys", cid: str, t: int | str) -> str:
        return f"{self.chunk(cid, t)}:{suffix}"
    key.__doc__ = doc or f"``<prefix>:{{cid}}:c:<t>:{suffix}``"
    return key


def _global_key(suffix: str):
    """A `Keys` property: the service-wide key ``<prefix>:{_global}:<suffix>``."""
    return property(lambda self: f"{self.global_stem}:{suffix}", doc=f"``<prefix>:{{{GLOBAL_TAG}}}:{suffix}``")


@functools.lru_cache(maxsize=1 << 14)
def _stem(prefix: str, cid: str) -> str:
    """`Keys.classifier`, remembered: an INGEST call names ~10 keys of one classifier (bounded:
    a cache of the most recent 16,384 states, whatever ids the topics carry)."""
    owner, negative = owner_of(cid)
    return f"{prefix}:{{{owner}}}:neg" if negative else f"{prefix}:{{{owner}}}"


class Keys:
    """Key names for one key prefix (``STRATAMETER_REDIS_KEY_PREFIX``)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    # ---- per classifier -----------------------------------------------------------------
    def classifier(self, cid: str) -> str:
        """The per-classifier stem ``<prefix>:{cid}`` every key of the classifier starts with
        (``<prefix>:{cid}:neg`` for the state of its predicted negatives, in the same slot)."""
        return _stem(self.prefix, cid)

    meta = _classifier_key("meta")
    scores_offsets = _classifier_key("offsets:scores")
    labels_offsets = _classifier_key("offsets:labels")
    chunks = _classifier_key("chunks")
    pending = _classifier_key("pending")
    counters = _classifier_key("counters")
    hourly = _classifier_key("hourly")
    joins = _classifier_key("joins", "``joins``: joined request id -> the request id it joined.")
    def lease(self, cid: str) -> str:
        """``<prefix>:{cid}:lease``: one for a classifier and its predicted negatives."""
        return f"{self.classifier(owner_of(cid)[0])}:lease"

    def request(self, cid: str, rid: str) -> str:
        return f"{self.classifier(cid)}:req:{rid}"

    # ---- per chunk ----------------------------------------------------------------------
    def chunk(self, cid: str, t: int | str) -> str:
        """The stem of chunk `t`'s keys (``...:c:<t>``)."""
        return f"{self.classifier(cid)}:c:{t}"

    chunk_meta = _chunk_key("meta")
    chunk_bins = _chunk_key("bins")
    chunk_hist = _chunk_key("hist", "``c:<t>:hist``: the histogram before `bins` (read and deleted, never written).")
    chunk_items = _chunk_key("N", "``c:<t>:N``: predicted positives per stratum.")
    chunk_labels = _chunk_key("n", "``c:<t>:n``: labels folded per stratum.")
    chunk_positives = _chunk_key("h", "``c:<t>:h``: positive labels per stratum.")
    chunk_pscores = _chunk_key("pscores")
    chunk_sampled = _chunk_key("sampled")
    chunk_replace = _chunk_key("replace")
    chunk_labelled = _chunk_key("labelled", "``c:<t>:labelled``: request id -> stratum, label and score of a label.")

    def reservoir(self, cid: str, t: int | str, k: int | str) -> str:
        return f"{self.chunk(cid, t)}:res:{k}"

    # ---- service-wide -------------------------------------------------------------------
    @property
    def global_stem(self) -> str:
        return f"{self.prefix}:{{{GLOBAL_TAG}}}"

    classifiers = _global_key("classifiers")
    instances = _global_key("instances")
    invalid = _global_key("invalid")
    labels_unknown = _global_key("labels_unknown")
    settings = _global_key("settings")
    applied = _global_key("applied")

    def acknowledged(self, sid: str) -> str:
        """``<prefix>:{_global}:acknowledged:<sid>``: the offsets state `sid`'s guards acknowledged."""
        return f"{self.global_stem}:acknowledged:{sid}"

    def probe(self, instance: str) -> str:
        """``<prefix>:{_global}:probe:<instance>``: the readiness probe's write (expires by itself)."""
        return f"{self.global_stem}:probe:{instance}"

    def global_offsets(self, scope: str) -> str:
        return f"{self.global_stem}:offsets:{scope}"

    # ---- per review group (a shared label budget) ---------------------------------------
    def group(self, group: str) -> str:
        """The stem ``<prefix>:{<group>~group}`` of a review group's keys (a slot of its own)."""
        return f"{self.prefix}:{{{group}{GROUP_SUFFIX}}}"

    def group_granted(self, group: str, hour: int) -> str:
        """``<prefix>:{<group>~group}:granted:<hour>``: the labels granted in clock hour `hour`."""
        return f"{self.group(group)}:granted:{hour}"

    def group_forecasts(self, group: str) -> str:
        """``<prefix>:{<group>~group}:forecasts``: its classifiers' chunks' forecasts."""
        return f"{self.group(group)}:forecasts"

    def group_item(self, group: str, item_id: str) -> str:
        """``<prefix>:{<group>~group}:item:<item_id>``: the first request of an item (CLAIM)."""
        return f"{self.group(group)}:item:{item_id}"

    # ---- the Label Studio bridge (service/bridge/) --------------------------------------
    def label_studio_request(self, cid: str, project: int, rid: str) -> str:
        """``<prefix>:{cid}:ls:<project>:<rid>``: the Label Studio task of request `rid` (in the
        slot of `cid`, the request's `classifier_id`)."""
        return f"{self.classifier(cid)}:ls:{project}:{rid}"

    def label_studio(self, project: int, what: str) -> str:
        """``<prefix>:{_global}:ls:<project>:<what>``, `what` one of ``open``, ``poller``, ``polled``."""
        if what not in ("open", "poller", "polled"):
            raise ValueError(f"no Label Studio key {what!r}")
        return f"{self.global_stem}:ls:{project}:{what}"

    # ---- the KEYS of the scripts whose keys depend on their arguments (lua/<name>.lua) --
    def ingest_keys(self, cid: str, chunks: Iterable[tuple[str, Iterable[int]]]) -> list[str]:
        """INGEST: the classifier's keys, then per (chunk, strata the payload adds reservoir
        members to), in the payload's order: meta, bins, N, pscores and those reservoirs."""
        keys = [self.scores_offsets(cid), self.meta(cid), self.chunks(cid)]
        for t, strata in chunks:
            keys += [self.chunk_meta(cid, t), self.chunk_bins(cid, t), self.chunk_items(cid, t),
                     self.chunk_pscores(cid, t)]
            keys += [self.reservoir(cid, t, k) for k in strata]
        return keys

    def restratify_keys(self, cid: str, t: int, strata: int) -> list[str]:
        """RESTRATIFY: the chunk's meta, N, pscores and its `strata` reservoirs."""
        return ([self.chunk_meta(cid, t), self.chunk_items(cid, t), self.chunk_pscores(cid, t)]
                + [self.reservoir(cid, t, k) for k in range(strata)])

    def freeze_keys(self, cid: str, t: int) -> list[str]:
        """FREEZE: the chunk's meta and pscores."""
        return [self.chunk_meta(cid, t), self.chunk_pscores(cid, t)]

    def label_keys(self, cid: str, rid: str, chunk: str) -> list[str]:
        """LABEL: the classifier's, the request's, its meta (does the state exist?), and (if
        `chunk`) that chunk's counts."""
        keys = [self.labels_offsets(cid), self.counters(cid), self.pending(cid), self.request(cid, rid), self.meta(cid)]
        if chunk:
            keys += [self.chunk_replace(cid, chunk), self.chunk_labels(cid, chunk), self.chunk_positives(cid, chunk),
                     self.chunk_labelled(cid, chunk)]
        return keys

    def forget_keys(self, cid: str, chunks: Iterable[int], max_strata: int) -> list[str]:
        """FORGET: the state's chunks first, then its other keys, its chunks' keys (every
        possible reservoir) and, for a classifier, its lease."""
        keys = [self.chunks(cid), self.meta(cid), self.scores_offsets(cid), self.labels_offsets(cid),
                self.pending(cid), self.counters(cid), self.hourly(cid), self.joins(cid)]
        if not owner_of(cid)[1]:
            keys.append(self.lease(cid))
        for t in chunks:
            keys += [self.chunk_meta(cid, t), self.chunk_bins(cid, t), self.chunk_hist(cid, t), self.chunk_items(cid, t),
                     self.chunk_labels(cid, t), self.chunk_positives(cid, t), self.chunk_pscores(cid, t),
                     self.chunk_sampled(cid, t), self.chunk_replace(cid, t), self.chunk_labelled(cid, t)]
            keys += [self.reservoir(cid, t, k) for k in range(max_strata)]
        return keys

    def issue_keys(self, cid: str, t: int, rids: Iterable[str]) -> list[str]:
        """ISSUE: the classifier's, the chunk's, then one per request id."""
        return ([self.lease(cid), self.pending(cid), self.counters(cid), self.hourly(cid), self.chunk_meta(cid, t),
                 self.chunk_sampled(cid, t), self.chunk_replace(cid, t), self.joins(cid)]
                + [self.request(cid, r) for r in rids])
