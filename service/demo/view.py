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

While the chunk is still open the service's variance has no finite population correction
(`stats.streams.chunk_interval`: the chunk is still growing), and neither has the random
sample's: ``n' = p (1 - p) / V``.  (Applying the correction to an open chunk's variance made
the random sample look cheaper than it is: at the end of a demo on a loaded machine, with
the last chunk not closed yet, 618 labels of the uninformative control against "319".)
"""

from __future__ import annotations

import math
from datetime import datetime

from rich.columns import Columns
from rich.console import Group
from rich import box
from rich.table import Table
from rich.text import Text


def random_equivalent_labels(estimate: float | None, stderr: float | None, population: int,
                             closed: bool = True) -> float | None:
    """Labels simple random sampling needs for variance ``stderr**2``: without replacement from
    the `population` of a closed chunk, with no finite population correction while it is open
    (see module doc)."""
    if estimate is None or stderr is None or population <= 0:
        return None
    p = min(max(float(estimate), 0.0), 1.0)
    pq = p * (1.0 - p)
    v = float(stderr) ** 2
    if pq == 0.0:
        return 0.0
    if not closed:
        return pq / v if v > 0 else math.inf
    return population * pq / ((population - 1) * v + pq)


def chunk_id(doc_chunk: dict | None, chunk_seconds: int) -> int | None:
    """The chunk id of a view's ``chunk`` {start, end} (start is a multiple of chunk_seconds)."""
    if not doc_chunk:
        return None
    start = datetime.fromisoformat(doc_chunk["start"].replace("Z", "+00:00")).timestamp()
    return int(round(start)) // int(chunk_seconds)


def row(doc: dict | None, classifier: str, truth_of, chunk_seconds: int, metric: str = "precision",
        whole_stream: bool = False) -> dict:
    """The summary entry of one metric of one classifier from its `/v1/classifiers/{id}` document.

    ``truth_of(classifier, chunk, metric)`` is the true value over that chunk's items.  The
    random-equivalent labels are those of precision from predicted positives alone (null for a
    classifier that samples both sides of its threshold: its labels serve every metric).
    """
    out = {"classifier": classifier, "metric": metric, "estimate": None, "lower": None, "upper": None,
           "truth": None, "labels": 0, "random_equivalent_labels": None}
    if not doc:
        return out
    chunk = chunk_id(doc.get("chunk"), chunk_seconds)
    iv = doc.get("metrics", {}).get(metric) or {}
    rel = None if whole_stream else random_equivalent_labels(iv.get("estimate"), iv.get("stderr"),
                                                             int(doc.get("population") or 0),
                                                             bool(doc.get("closed", True)))
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


def _hhmmss(doc_chunk: dict | None) -> str:
    if not doc_chunk:
        return "-"
    return doc_chunk["start"][11:19]


def summary_table(rows: list[dict], docs: dict[str, dict | None], confidence: float, title: str) -> Table:
    # fits an 80-column terminal: numbers never shrink (min_width), names and status may wrap
    t = Table(title=title, title_justify="left", expand=False, box=box.SIMPLE_HEAD, pad_edge=False,
              show_edge=False, padding=(0, 0))
    for name, just, width in (("classifier", "left", 17), ("est.", "right", 5),
                              (f"{confidence:.0%} CI", "center", 14), ("truth", "left", 11),
                              ("labels", "right", 6), ("random", "right", 6), ("saved", "right", 5),
                              ("status", "left", 9)):
        t.add_column(name, justify=just, no_wrap=name != "status", min_width=width, overflow="fold")
    for r in rows:
        doc = docs.get(r["classifier"]) or {}
        cov = covered(r)
        truth = Text(_f(r["truth"]))
        truth.append("" if cov is None else "  in" if cov else "  MISS",
                     style="" if cov is None else "green" if cov else "bold red")
        rel = r["random_equivalent_labels"]
        saved = "-" if not rel or not r["labels"] else f"{1 - r['labels'] / rel:.0%}"
        interval = "-" if r["lower"] is None else f"[{r['lower']:.3f}, {r['upper']:.3f}]"
        name = r["classifier"] if r.get("metric", "precision") == "precision" else f"  {r['metric']}"
        t.add_row(name, _f(r["estimate"]), interval, truth,
                  str(r["labels"]), _f(rel, ".0f"), saved, str(doc.get("status", "-")))
    return t


def strata_table(classifier: str, doc: dict | None) -> Table:
    """The reported chunk's strata, and the boundaries of the last chunks (they follow the scores)."""
    chunk = f"  (chunk {_hhmmss(doc.get('chunk'))})" if doc else ""
    t = Table(title=classifier + chunk, title_justify="left", show_edge=False, pad_edge=False)
    for name in ("stratum (score range)", "items", "labels", "prec."):
        t.add_column(name, justify="left" if name.startswith("stratum") else "right", no_wrap=True)
    if not doc:
        return t
    for s in doc.get("strata", []):
        t.add_row(f"{s['stratum']}  [{_f(s['lower_score'])}, {_f(s['upper_score'])}]", str(s["items"]),
                  str(s["labels"]), _f(s["precision"], ".2f"))
    chunks = sorted([c for c in doc.get("history", []) if c.get("chunk")] + ([doc] if doc.get("chunk") else []),
                    key=lambda c: c["chunk"]["start"])[-4:]
    if chunks:
        t.caption = "boundaries by chunk:\n" + "\n".join(
            f"{_hhmmss(c['chunk'])}  " + " | ".join(_f(s["upper_score"], ".2f") for s in c["strata"][:-1])
            for c in chunks)
        t.caption_justify = "left"
    return t


def render(header: str, rows: list[dict], docs: dict[str, dict | None], confidence: float, footer: str = ""):
    parts = [Text(header),
             summary_table(rows, docs, confidence, "estimate of the reported chunk vs the truth of that chunk"),
             Columns([strata_table(r["classifier"], docs.get(r["classifier"])) for r in rows
                      if r.get("metric", "precision") == "precision"], padding=(1, 3))]
    if footer:
        parts.append(Text(footer, style="dim"))
    return Group(*parts)
