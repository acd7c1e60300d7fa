"""What the demo reports: per classifier the service's estimate against the truth,
the labels it used against what uniform random sampling would have needed, and
the strata; the summary document and the rich live view.

Random-equivalent labels
------------------------
For an estimate ``p`` with variance ``V`` (the service's ``stderr`` squared: the
stratified variance with the finite population correction over the chunk's
``N`` items), the number of labels a simple random sample without replacement
from the same ``N`` items needs for the same variance, i.e. the same interval:

    p (1 - p) / n' * (N - n') / (N - 1) = V   =>   n' = N p (1 - p) / ((N - 1) V + p (1 - p))

This is ``labels * var_random / var_stratified`` made exact (for large ``N`` it is
Kish's effective sample size ``p (1 - p) / V``, so also ``z^2 p (1 - p) / halfwidth^2``
for the normal interval); and since the service's interval is Wilson's with that
effective sample size, a random sample of ``n'`` labels gets the same interval.
``labels < n'`` means stratification saved labels.

For a classifier sampled on both sides of its threshold (the whole stream), the random
sample is one of the chunk's items on either side, and ``p (1 - p)`` becomes the variance
of one item's linearized contribution to the metric (`unit_variance`): precision
``P (1 - P) / pi`` (``pi`` the share of predicted positives: a random item is one of them
that often), recall ``R (1 - R) / y`` (``y`` the share truly positive, ``pi P / R``), F1
``(4 tp (1 - F)^2 + (fp + fn) F^2) / (2 tp + fp + fn)^2`` (the shares of true positives,
false positives and false negatives), accuracy ``A (1 - A)``; all from the service's own
estimates and the items of each side.

While the chunk is still open the service's variance has no finite population correction
(`stats.streams.chunk_interval`: the chunk is still growing), and neither has the random
sample's: ``n' = p (1 - p) / V``.  (Applying the correction to an open chunk's variance made
the random sample look cheaper than it is: at the end of a demo on a loaded machine, with
the last chunk not closed yet, 618 labels of the uninformative control against "319".)
"""

from __future__ import annotations

import math
from datetime import datetime

from rich import box
from rich.table import Table
from rich.text import Text


def random_equivalent_labels(estimate: float | None, stderr: float | None, population: int,
                             closed: bool = True, unit: float | None = None) -> float | None:
    """Labels simple random sampling needs for variance ``stderr**2``: without replacement from
    the `population` of a closed chunk, with no finite population correction while it is open
    (see module doc).  `unit`: one item's variance (`unit_variance`), by default ``p (1 - p)``."""
    if estimate is None or stderr is None or population <= 0:
        return None
    p = min(max(float(estimate), 0.0), 1.0)
    pq = p * (1.0 - p) if unit is None else unit
    v = float(stderr) ** 2
    if pq == 0.0:
        return 0.0
    if not closed:
        return pq / v if v > 0 else math.inf
    return population * pq / ((population - 1) * v + pq)


def unit_variance(metric: str, metrics: dict, positive_share: float | None) -> float | None:
    """One item's variance for `metric` under simple random sampling of a chunk's items on both
    sides of the threshold (module doc), from the chunk's estimates (`metrics`: the document's
    ``metrics``) and its share of predicted positives; None where a figure it needs is missing."""
    est = {m: _clip((metrics.get(m) or {}).get("estimate")) for m in ("precision", "recall", metric)}
    x, share, precision, recall = est[metric], positive_share, est["precision"], est["recall"]
    if x is None or share is None:
        return None
    if metric == "accuracy":
        return x * (1.0 - x)
    if precision is None or share <= 0.0:
        return None
    if metric == "precision":
        return precision * (1.0 - precision) / share
    if not recall:
        return None
    tp = share * precision
    fn, fp = tp * (1.0 - recall) / recall, share * (1.0 - precision)
    if metric == "recall":
        return recall * (1.0 - recall) / (tp + fn)
    if metric == "f1":
        return (4.0 * tp * (1.0 - x) ** 2 + (fp + fn) * x ** 2) / (2.0 * tp + fp + fn) ** 2
    return None


def positive_share(chunk: dict) -> float | None:
    """The share of a chunk's items on the predicted-positive side (its strata's items)."""
    items = [(s.get("side", "positive"), s["items"]) for s in chunk.get("strata", [])]
    total = sum(n for _, n in items)
    return sum(n for side, n in items if side == "positive") / total if total else None


def _clip(x) -> float | None:
    return None if x is None else min(max(float(x), 0.0), 1.0)


def closed_and_open(doc: dict | None) -> tuple[dict | None, dict | None]:
    """A `/v1/classifiers/{id}` document's last closed chunk and its open one (each a chunk with the
    reported chunk's fields: ``chunk``, ``metrics``, ``labels``, ``status``, ...; None when there is
    none): the reported chunk and ``history`` hold them.  The open one is the reported chunk while
    it is open (so a chunk that has ended but not closed yet, `ALLOWED_LATENESS_SECONDS`, stays in
    view until the new one has an interval), else the newest open chunk."""
    if not doc:
        return None, None
    chunks = [c for c in (doc, *doc.get("history", ())) if c.get("chunk")]
    last = (doc.get("last_closed") or {}).get("chunk") or {}
    closed = next((c for c in chunks if c["chunk"]["start"] == last.get("start")), None)
    opened = doc if doc.get("chunk") and not doc.get("closed") else max(
        (c for c in chunks if not c.get("closed")), key=lambda c: c["chunk"]["start"], default=None)
    return closed, opened


def chunk_id(doc_chunk: dict | None, chunk_seconds: int) -> int | None:
    """The chunk id of a view's ``chunk`` {start, end} (start is a multiple of chunk_seconds)."""
    if not doc_chunk:
        return None
    start = datetime.fromisoformat(doc_chunk["start"].replace("Z", "+00:00")).timestamp()
    return int(round(start)) // int(chunk_seconds)


def row(doc: dict | None, classifier: str, truth_of, chunk_seconds: int, metric: str = "precision",
        whole_stream: bool = False) -> dict:
    """The summary entry of one metric of one classifier from its `/v1/classifiers/{id}` document
    (or one chunk of it: the same fields).

    ``truth_of(classifier, chunk, metric)`` is the true value over that chunk's items.  The
    random-equivalent labels: of a random sample of the predicted positives, or, for a classifier
    that samples both sides of its threshold (`whole_stream`), of the chunk's whole stream (its
    labels serve every metric; module doc).
    """
    out = {"classifier": classifier, "metric": metric, "estimate": None, "lower": None, "upper": None,
           "truth": None, "labels": 0, "random_equivalent_labels": None}
    if not doc:
        return out
    chunk = chunk_id(doc.get("chunk"), chunk_seconds)
    iv = doc.get("metrics", {}).get(metric) or {}
    unit = unit_variance(metric, doc.get("metrics", {}), positive_share(doc) if whole_stream else 1.0)
    rel = None if unit is None else random_equivalent_labels(iv.get("estimate"), iv.get("stderr"),
                                                             int(doc.get("population") or 0),
                                                             bool(doc.get("closed", True)), unit)
    out.update({
        "estimate": _round(iv.get("estimate")), "lower": _round(iv.get("ci_lower")),
        "upper": _round(iv.get("ci_upper")),
        "truth": _round(truth_of(classifier, chunk, metric) if chunk is not None else None),
        "labels": int(doc.get("labels") or 0),
        "random_equivalent_labels": None if rel is None else round(rel, 1),
    })
    return out


def _round(x, digits: int = 6):
    return None if x is None or not math.isfinite(x) else round(float(x), digits)


def covered(r: dict) -> bool | None:
    if r["lower"] is None or r["truth"] is None:
        return None
    return r["lower"] <= r["truth"] <= r["upper"]


# --------------------------------------------------------------------------- rendering


def _f(x, fmt: str = ".3f", empty: str = "-") -> str:
    return empty if x is None else format(x, fmt)


def summary_table(rows: list[dict], docs: dict[str, dict | None], confidence: float, title: str) -> Table:
    """One row per classifier and metric; `docs`: each classifier's chunk the rows describe (its
    ``status``, ``closed``).  'saved' only for a chunk that is closed or has converged: right after
    a switch the new chunk's first labels are a pilot, and its savings mean nothing yet.  A
    classifier's labels serve all its metrics: its 'saved', on its first row, is against the largest
    'random' of its rows (the random sample that gives every one of its intervals)."""
    # fits an 80-column terminal: numbers never shrink (min_width), names and status may wrap
    t = Table(title=title, title_justify="left", expand=False, box=box.SIMPLE_HEAD, pad_edge=False,
              show_edge=False, padding=(0, 0))
    for name, just, width in (("classifier", "left", 17), ("est.", "right", 5),
                              (f"{confidence:.0%} CI", "center", 14), ("truth", "left", 11),
                              ("labels", "right", 6), ("random", "right", 6), ("saved", "right", 5),
                              ("status", "left", 9)):
        t.add_column(name, justify=just, no_wrap=name != "status", min_width=width, overflow="fold")
    first = None
    for r in rows:
        doc = docs.get(r["classifier"]) or {}
        cov = covered(r)
        truth = Text(_f(r["truth"]))
        truth.append("" if cov is None else "  in" if cov else "  MISS",
                     style="" if cov is None else "green" if cov else "bold red")
        saved = ""
        if r["classifier"] != first:  # the classifier's first row
            first = r["classifier"]
            saved = _saved([x for x in rows if x["classifier"] == first], doc)
        interval = "-" if r["lower"] is None else f"[{r['lower']:.3f}, {r['upper']:.3f}]"
        name = r["classifier"] if r.get("metric", "precision") == "precision" else f"  {r['metric']}"
        t.add_row(name, _f(r["estimate"]), interval, truth, str(r["labels"]),
                  _f(r["random_equivalent_labels"], ".0f"), saved, str(doc.get("status", "-")))
    return t


def _saved(rows: list[dict], doc: dict) -> str:
    """1 - labels / the largest random-equivalent of a classifier's `rows` (its metrics), for a
    chunk that is closed or has converged; '-' otherwise."""
    random = [r["random_equivalent_labels"] for r in rows]
    if None in random or not max(random) or not rows[0]["labels"]:
        return "-"
    if not (doc.get("closed") or doc.get("status") == "converged"):
        return "-"
    return f"{round(100 * (1 - rows[0]['labels'] / max(random)))}%"  # an int: never "-0%"
