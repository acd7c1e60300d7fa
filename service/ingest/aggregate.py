"""Turn one partition's batch of parsed score records into per-classifier state
deltas: one payload per classifier for the INGEST script, so Redis is touched
once per classifier per batch, never per record.

Pure numpy; no I/O.  Each payload carries, per event-time chunk: the score
histogram's change (the sketch later chunks' boundaries come from; `bins`), the
predicted-positive count per stratum, and the reservoir candidates (the
bottom-k priorities of the batch per stratum; Redis keeps the global
bottom-k, which is a uniform sample of the stratum whatever the batching or
the number of instances feeding it), and the version of the strata boundaries it
was aggregated with; for a provisional chunk (one stratum until it is
re-stratified, see `stratameter.ingest.ingestor`) also its exact scores.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import orjson

from ..stats.sketch import BINS, bin_index
from .bins import histogram_increments
from .priorities import item_priorities

#: A reservoir keeps its RESERVOIR_SIZE lowest priorities and, beyond them, every member at
#: or below its stratum's inclusion threshold (the threshold sample, `stats.streams`), up to
#: this many times RESERVOIR_SIZE members (INGEST, which reads it from the payload).
SAMPLE_CAP = 4
#: `ClassifierRecords.shared`'s mark that both sides' payloads are built from the records.
BOTH_SIDES = "both_sides"


@dataclass
class ClassifierRecords:
    """The valid records of one classifier in one partition batch.

    Numeric columns are arrays; item ids and contexts stay in the batch-wide
    lists and are looked up through `rows` only for the few reservoir
    candidates, so nothing is copied per record."""

    classifier_id: str
    offsets: np.ndarray  # int64, increasing
    rows: np.ndarray  # positions in the batch-wide lists
    items: list  # batch-wide item ids
    contexts: list  # batch-wide contexts (compact JSON text or bytes, or None)
    score: np.ndarray  # float64
    positive: np.ndarray  # bool
    event_ms: np.ndarray  # int64
    #: Columns of these records their payloads compute (chunk ids, priorities, score buckets),
    #: computed once (`_once`) and shared with their `negatives`
    shared: dict = field(default_factory=dict, repr=False, compare=False)

    def item_id(self, i: int) -> str:
        return self.items[self.rows[i]]

    def context(self, i: int):
        return self.contexts[self.rows[i]]

    def after(self, offset: int) -> "ClassifierRecords":
        """The records with an offset above `offset` (for replays)."""
        if self.size == 0 or self.offsets[0] > offset:
            return self
        keep = self.offsets > offset
        return ClassifierRecords(self.classifier_id, self.offsets[keep], self.rows[keep], self.items, self.contexts,
                                 self.score[keep], self.positive[keep], self.event_ms[keep])

    @property
    def size(self) -> int:
        return int(self.offsets.size)

    def negatives(self, state_id: str) -> "ClassifierRecords":
        """The same records for the state of the predicted negatives (`state.keys.negatives_of`):
        what that state samples ("positive" in `build_payload`) is the predicted negatives.  The
        two share the columns their payloads compute alike (`shared`).  A record's one priority
        serves the side it is on: the sides' records are disjoint, so each side's priorities stay
        independent uniforms."""
        self.shared[BOTH_SIDES] = True
        return ClassifierRecords(state_id, self.offsets, self.rows, self.items, self.contexts, self.score,
                                 ~self.positive, self.event_ms, self.shared)


def group_by_classifier(offsets, classifier_ids, item_ids, scores, positive, event_ms, contexts
                        ) -> list[ClassifierRecords]:
    """Split a parsed batch by classifier, keeping record order."""
    codes = {cid: i for i, cid in enumerate(dict.fromkeys(classifier_ids))}
    offsets, scores = np.asarray(offsets), np.asarray(scores)
    positive, event_ms = np.asarray(positive), np.asarray(event_ms)
    if len(codes) == 1:  # common: a partition carries few classifiers, a batch often one
        rows = np.arange(len(classifier_ids))
        return [ClassifierRecords(classifier_ids[0], offsets, rows, item_ids, contexts, scores, positive, event_ms)]
    code = np.fromiter(map(codes.__getitem__, classifier_ids), dtype=np.int64, count=len(classifier_ids))
    out = []
    for cid, c in codes.items():
        rows = np.flatnonzero(code == c)
        out.append(ClassifierRecords(cid, offsets[rows], rows, item_ids, contexts, scores[rows], positive[rows],
                                     event_ms[rows]))
    return out


def chunk_of(event_ms: np.ndarray, chunk_seconds: int) -> np.ndarray:
    """Chunk id: event time in whole multiples of `chunk_seconds` since the epoch (UTC)."""
    return np.floor_divide(np.asarray(event_ms, dtype=np.int64), 1000 * int(chunk_seconds))


def _pairs(keys: np.ndarray, counts: np.ndarray) -> list[int]:
    out = np.empty(2 * keys.size, dtype=np.int64)
    out[0::2], out[1::2] = keys, counts
    return out.tolist()


def member(item_id: str, score: float, context: str | bytes | None) -> str:
    """The reservoir entry of one item (what a label request needs)."""
    return orjson.dumps({"i": item_id, "s": score, "x": orjson.Fragment(context) if context else None}).decode()


def members(item_ids: list[str], scores, contexts: list) -> list[str]:
    """`member` of each item, the same text, built in bulk: the ids and the scores (a list or a
    float array) are JSON-encoded in one orjson call each and split, then each entry is one
    format.  A third less time than `member` per item, and most of what a reservoir candidate
    costs the ingestor.  The ids' text is split on ``","`` only when no id holds a quote: an
    escaped quote, a comma and the closing quote (an id ending in ``",``) read as that separator
    too; then each id is encoded on its own."""
    if not item_ids:
        return []
    text = orjson.dumps(item_ids).decode()
    if '\\"' in text:
        ids = [orjson.dumps(i).decode()[1:-1] for i in item_ids]
    else:
        ids = text[2:-2].split('","')
    texts = float_texts(scores)
    return [f'{{"i":"{i}","s":{s},"x":{c if c.__class__ is str and c else _context_text(c)}}}'
            for i, s, c in zip(ids, texts, contexts)]


def float_texts(values) -> list[str]:
    """Each float's shortest text that reads back as the same float (orjson's), in one call: the
    list's JSON text split (a float's text holds no comma)."""
    if not len(values):
        return []
    return orjson.dumps(values, option=orjson.OPT_SERIALIZE_NUMPY).decode()[1:-1].split(",")


def _context_text(context: str | bytes | None) -> str:
    if not context:
        return "null"
    return context if type(context) is str else bytes(context).decode()


def _candidates(recs: ClassifierRecords, sel: np.ndarray, priority: np.ndarray) -> list:
    """Flat ``[priority, member, ...]`` of the records at positions `sel`, converted from the
    arrays once rather than per element.  The priorities go as text (`float_texts`): INGEST
    passes them on to ZADD, and a Lua number passed to a Redis command is formatted by Redis
    with ``%.17g``, glibc's multiprecision printf: about 2,000 instructions a candidate, a sixth
    of Redis's work on the bench (callgrind, 2026-11-28).  The text is exact, so the sorted set
    holds the same float."""
    rows = recs.rows[sel].tolist()
    entries = members(list(map(recs.items.__getitem__, rows)), recs.score[sel],
                      list(map(recs.contexts.__getitem__, rows)))
    out: list = [None] * (2 * len(entries))
    out[0::2] = float_texts(priority[sel])
    out[1::2] = entries
    return out


def score_counts(scores: np.ndarray) -> list:
    """Exact score multiset as flat [repr(score), count, ...] pairs (repr round-trips a
    float exactly, also through Lua's tonumber), for a provisional chunk's `pscores`."""
    values, counts = np.unique(np.asarray(scores, dtype=float), return_counts=True)
    out: list = []
    for v, c in zip(values.tolist(), counts.tolist()):
        out.append(repr(v))
        out.append(c)
    return out


def distinct_chunks(chunks: np.ndarray) -> list[int]:
    """The distinct chunk ids in `chunks`, in order.  A batch usually falls in one chunk, found
    with two reductions instead of `np.unique`'s sort (a third of its time on a call's records)."""
    if not chunks.size:
        return []
    first, last = int(chunks.min()), int(chunks.max())
    return [first] if first == last else np.unique(chunks).tolist()


def _once(recs: ClassifierRecords, name, make):
    """`make()`, computed once for the records and their other side (`ClassifierRecords.shared`)."""
    out = recs.shared.get(name)
    if out is None:
        out = recs.shared[name] = make()
    return out


def _chunks(recs: ClassifierRecords, chunk_seconds: int) -> tuple[np.ndarray, list[int]]:
    """The chunk of each record, and the distinct ones (`chunk_of`, `distinct_chunks`)."""
    chunks = _once(recs, ("chunks", chunk_seconds), lambda: chunk_of(recs.event_ms, chunk_seconds))
    return chunks, _once(recs, ("distinct", chunk_seconds), lambda: distinct_chunks(chunks))


def positives_by_chunk(recs: ClassifierRecords, chunk_seconds: int) -> list[tuple[int, np.ndarray]]:
    """(chunk id, positions of its predicted positives) per chunk, in chunk order."""
    chunks, every = _chunks(recs, chunk_seconds)
    pos = np.flatnonzero(recs.positive)
    if len(every) == 1:
        return [(every[0], pos)] if pos.size else []
    of = chunks[pos]
    ids = distinct_chunks(of)
    if len(ids) == 1:
        return [(ids[0], pos)]
    return [(t, pos[of == t]) for t in ids]


def _reservoir_candidates(recs: ClassifierRecords, sel: np.ndarray, stratum: np.ndarray, priority: np.ndarray,
                          cut: np.ndarray | None, reservoir_size: int) -> list:
    """``[[k, [priority, member, ...]], ...]``: per stratum (in stratum order), the records at
    `sel` that can still enter its reservoir.  Where the cutoff of a full reservoir is known
    (`cut`, inf where not), every record under it, at most SAMPLE_CAP x `reservoir_size`
    (those above the reservoir's largest priority are under the stratum's threshold, INGEST);
    elsewhere the batch's bottom `reservoir_size`."""
    known = np.zeros(0, dtype=bool)
    if cut is not None:
        # a stratum the cutoffs do not cover yet (more strata than when they were noted) is unfiltered
        bound = np.append(cut, np.inf)[np.minimum(stratum, cut.size)]
        keep = priority[sel] <= bound
        sel, stratum = sel[keep], stratum[keep]
        if not sel.size:  # the common case once the reservoirs are full
            return []
        known = np.isfinite(cut)
    order = np.argsort(stratum, kind="stable")
    counts = np.bincount(stratum)
    ends = np.cumsum(counts)
    strata, parts = [], []
    for k in np.flatnonzero(counts).tolist():
        in_k = sel[order[ends[k] - counts[k]:ends[k]]]
        limit = SAMPLE_CAP * reservoir_size if k < known.size and known[k] else reservoir_size
        if in_k.size > limit:
            in_k = in_k[np.argpartition(priority[in_k], limit - 1)[:limit]]
        strata.append(k)
        parts.append(in_k)
    if not strata:
        return []
    # one `_candidates` for every stratum, then cut per stratum: its fixed cost is paid once a call
    flat = _candidates(recs, np.concatenate(parts), priority)
    out, at = [], 0
    for k, in_k in zip(strata, parts):
        out.append([k, flat[at:at + 2 * in_k.size]])
        at += 2 * in_k.size
    return out


def build_payload(recs: ClassifierRecords, chunk_seconds: int, cuts_for, reservoir_size: int,
                  now_ms: int, rng: np.random.Generator, cutoffs_for=None, cap: int = 0, bins_for=None,
                  sharing_group: str | None = None) -> dict:
    """The INGEST payload of one classifier's records (see state.scripts.INGEST).

    `cuts_for(chunk)` returns the chunk's stored strata boundaries: an object with
    `cuts`, `version` and `provisional` (`state.records.ChunkCuts`).  A provisional chunk's
    entry also carries `cap` (the items at which it must be re-stratified first), its
    item count `n` and its exact scores `ps`.
    `cutoffs_for(chunk)`, if given, returns None or per stratum the cutoff of a full
    reservoir (INGEST: the larger of its largest priority and the stratum's threshold;
    inf where unknown): candidates above it could never enter, so they are not sent
    (once the reservoirs are full, almost none are).
    `bins_for(chunk)`, if given, returns the ingestor's copy of the chunk's histogram counters
    (`bins.ChunkBins`), which the batch is added to and written from (runs of counters);
    without it the histogram goes as increments.
    `sharing_group`: the review group that shares items the classifier is in, whose priorities are
    drawn from the item ids (`priorities.item_priorities`) instead of `rng`.
    """
    priority = _once(recs, "priority", lambda: rng.random(recs.size) if sharing_group is None else
                     item_priorities(list(map(recs.items.__getitem__, recs.rows.tolist())),
                                     _chunks(recs, chunk_seconds)[0], sharing_group))
    out_chunks = []
    for t, sel in positives_by_chunk(recs, chunk_seconds):
        s = recs.score[sel]
        if recs.shared.get(BOTH_SIDES):  # both sides' in one pass
            bucket = _once(recs, "bucket", lambda: bin_index(recs.score))[sel]
        else:
            bucket = bin_index(s)
        per_bucket = np.bincount(bucket, minlength=BINS)
        buckets = np.flatnonzero(per_bucket != 0)  # a third of the time of nonzero on the counts
        strata_t = cuts_for(t)
        # `strata.assign` without its finiteness check: the parser admits finite scores only
        stratum = np.searchsorted(strata_t.cuts, s, side="right")
        per_stratum = np.bincount(stratum)
        strata = np.flatnonzero(per_stratum)
        cut = cutoffs_for(t) if cutoffs_for is not None else None
        lo, hi = float(s.min()), float(s.max())
        entry = {
            "t": str(t), "N": _pairs(strata, per_stratum[strata]),
            "res": _reservoir_candidates(recs, sel, stratum, priority, cut, reservoir_size),
            "lo": lo, "hi": hi, "lo_s": repr(lo), "hi_s": repr(hi), "v": int(strata_t.version),
        }
        entry.update(bins_for(t).add(buckets, per_bucket[buckets]) if bins_for is not None
                     else {"hist": histogram_increments(buckets, per_bucket[buckets])})
        if strata_t.provisional:
            entry.update(cap=int(cap), n=int(sel.size), ps=score_counts(s))
        out_chunks.append(entry)
    return {
        "scores": recs.size,
        "now": int(now_ms),
        "last_event": int(recs.event_ms.max()) if recs.size else -1,
        "chunks": out_chunks,
        "res_size": int(reservoir_size),
        "sample_cap": SAMPLE_CAP,
    }
