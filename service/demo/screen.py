"""The demo's live screen: what it is doing, the last closed chunk and the open one of every
classifier against their truth (two tables of `view.summary_table`), the legend, and the strata
boundaries of the last chunks.

Made to fit 80 columns: every line of the header and of the tables is at most 80 characters, and
the legend comes before the boundaries, so a short terminal loses the boundaries first.  The last
closed chunk's figures stand above the open chunk's: right after a switch the open chunk has only its
pilot labels, and its savings are not shown until it converges (`view.summary_table`).
"""

from __future__ import annotations

import time

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from . import view
from .scenarios import SCENARIOS

#: Chunks shown in the boundaries table (three fit 80 columns).
BOUNDARY_CHUNKS = 3

LEGEND = ("'truth': the chunk's true value of the metric ('in' or 'MISS': inside its interval or not). "
          "'random': the labels a uniform random sample of the chunk needs for the same interval (same "
          "variance): of its predicted positives, or of its whole stream for a classifier sampled on both "
          "sides of its threshold. 'saved' = 1 - labels / random, once the chunk has closed or converged; for "
          "several metrics, against the largest 'random' (a sample that gives every interval). "
          "The boundaries: the scores between the predicted positives' strata; the strata in detail: the "
          "status page.   Ctrl-C stops.")


def render(demo) -> Group:
    """The screen of a running `orchestra.Demo`."""
    closed, opened = _closed_and_open(demo)
    parts = [Text(_header(demo)), Text(""), _table(demo, closed, "last closed chunk"), Text(""),
             _table(demo, opened, "open chunk"), Text("")]
    parts.append(Text("\n".join(f"{s.classifier}: {s.description}" for s in SCENARIOS) + "\n" + LEGEND,
                      style="dim"))
    parts += [Text(""), boundaries_table(demo.docs)]
    return Group(*parts)


def summary(demo, title: str) -> Group:
    """What the demo prints at the end: the last closed chunk, and the reported one (the chunk
    ``--json`` reports, `orchestra.Demo.summary`) when it is another."""
    closed, _ = _closed_and_open(demo)
    if all((closed[c] or {}).get("chunk") == (doc or {}).get("chunk") for c, doc in demo.docs.items()):
        return Group(_table(demo, closed, f"{title}: the last closed chunk", " (the one --json reports)"))
    return Group(_table(demo, closed, f"{title}: the last closed chunk"), Text(""),
                 _table(demo, demo.docs, "the reported chunk", " (the one --json reports)"))


def _closed_and_open(demo) -> tuple[dict, dict]:
    """Per classifier, its last closed chunk and its open one (`view.closed_and_open`)."""
    closed, opened = {}, {}
    for s in SCENARIOS:
        closed[s.classifier], opened[s.classifier] = view.closed_and_open(demo.docs.get(s.classifier))
    return closed, opened


def _table(demo, chunks: dict[str, dict | None], title: str, note: str = ""):
    """`view.summary_table` of one chunk per classifier (`chunks`), its start times in the title."""
    o = demo.opts
    rows = [view.row(chunks.get(s.classifier), s.classifier, demo.truth.truth, o.chunk_seconds, m,
                     whole_stream=s.whole_stream) for s in SCENARIOS for m in s.metrics]
    return view.summary_table(rows, chunks, o.confidence, f"{title} {_starts(chunks.values())}{note}")


def _header(demo) -> str:
    o = demo.opts
    elapsed = time.time() - demo.started
    total = f" / {demo.ends_at - demo.started:.0f}s" if demo.ends_at else ""
    page = demo.metrics_url.removesuffix("metrics")
    lines = [f"stratameter demo   {demo.phase} {elapsed:.0f}s{total}   status page {page}",
             f"chunks of {o.chunk_seconds}s (UTC), delta {o.delta}, confidence {o.confidence:.0%}, "
             f"{o.rate:g} scores/s per classifier"]
    sent = sum(demo.truth.sent.values())
    if demo.label_studio is None:
        lines.append(f"scores sent {sent}, labels answered {demo.answered}, skipped {demo.skipped}")
    else:
        ls = demo.label_studio
        lines.append(f"scores sent {sent}; reviewers: you, in Label Studio {ls.url} "
                     f"(login {ls.user} / {ls.password})")
    drift = ""
    if hasattr(demo, "switch_chunk"):
        drift = ("fraud-degrading drifts at "
                 + time.strftime("%H:%M:%S", time.gmtime(demo.switch_chunk * o.chunk_seconds)) + "   ")
    lines.append(f"{drift}metrics {demo.metrics_url}")
    return "\n".join(lines)


def _starts(chunks) -> str:
    """The start times (HH:MM:SS, UTC) of the chunks shown: one, unless the classifiers differ."""
    starts = sorted({c["chunk"]["start"][11:19] for c in chunks if c and c.get("chunk")})
    return ", ".join(starts) if starts else "(none yet)"


def boundaries_table(docs: dict[str, dict | None]) -> Table:
    """Per classifier, the scores between its predicted positives' strata in each of the last
    chunks: they follow the score distribution (toxicity-shifting's slide chunk by chunk)."""
    by_class = {cid: {c["chunk"]["start"]: c for c in (doc, *doc.get("history", ())) if c.get("chunk")}
                for cid, doc in docs.items() if doc}
    starts = sorted(set().union(*by_class.values()))[-BOUNDARY_CHUNKS:] if by_class else []
    t = Table(title="strata boundaries (score) by chunk", title_justify="left",
              box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 0))
    t.add_column("classifier", min_width=17, no_wrap=True)
    for start in starts:
        t.add_column(start[11:19], justify="left", no_wrap=True, min_width=17)
    for cid, chunks in by_class.items():
        cells = []
        for start in starts:
            strata = [s for s in (chunks.get(start) or {}).get("strata", []) if s.get("side", "positive") == "positive"]
            cells.append(" ".join("-" if s["upper_score"] is None else f"{s['upper_score']:.2f}"
                                  for s in strata[:-1]) or "-")
        t.add_row(cid, *cells)
    return t
