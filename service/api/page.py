"""The status page: `GET /` lists every classifier with its window, its last closed chunk and its
current chunk; `GET /classifiers/{id}` shows one classifier's held history as a band over time,
its windows and the strata of its current chunk.

Server-rendered HTML from the very documents the JSON API serves (`views.classifier_view`), with
the charts drawn as inline SVG: no script, no build step, nothing fetched from elsewhere.  Pure:
documents in, text out.
"""

from __future__ import annotations

import math
from html import escape
from urllib.parse import quote

from stratameter.schemas.times import format_time, rfc3339_to_ms

from ..stats.estimator import z_value

#: the classifiers the overview lists at most (sorted by id); the JSON API has them all
OVERVIEW_LIMIT = 200
#: the classifiers a review group's row names at most; /v1/review-groups/{group} has them all
GROUP_MEMBERS_LIMIT = 20

_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:24px 0 6px}
table{border-collapse:collapse;margin:8px 0}td,th{padding:4px 10px;border-bottom:1px solid #ddd;text-align:left}
th{background:#f4f6f8;font-weight:600}.num{text-align:right;font-variant-numeric:tabular-nums}
.muted{color:#888}.status{padding:1px 6px;border-radius:8px;background:#eef}
.converged{background:#dfd}.waiting_for_budget{background:#fed}.exhausted,.stopped{background:#eee}
svg text{font-size:11px;fill:#555}
"""


def overview_page(docs: list[dict], total: int, groups: list[dict] = ()) -> str:
    """Every classifier (the first `OVERVIEW_LIMIT` of `total`, each its `classifier_view` without
    history) with its first window, last closed chunk and current chunk; and the review groups'
    shared budgets (`groups`: `review_groups.group_docs`), if any group has one."""
    rows = "".join(_overview_row(d) for d in docs)
    more = (f"<p class=muted>{total - len(docs)} more classifiers: see /v1/classifiers</p>"
            if total > len(docs) else "")
    head = ("<tr><th>classifier</th><th>window</th><th>last closed chunk</th><th>current chunk</th>"
            "<th class=num>labels</th><th class=num>random sample needs</th><th>status</th>"
            "<th class=num>budget left</th></tr>")
    body = (f"<h1>stratameter</h1><p class=muted>{total} classifiers; precision (the top-level figures) with its "
            f"confidence interval</p><table>{head}{rows}</table>{more}{_review_budgets(groups)}"
            "<p class=muted>JSON: /v1/classifiers/{id} &middot; Prometheus: /metrics</p>")
    return _html("stratameter", body)


def classifier_page(doc: dict) -> str:
    """One classifier: every enabled metric's held history as a band, its windows, its last closed
    chunk and the strata of its current chunk."""
    cid = escape(doc["classifier_id"])
    chunks = sorted([doc, *doc["history"]], key=lambda c: c["chunk"]["start"] if c["chunk"] else "")
    charts = "".join(f"<h2>{escape(m)}</h2>{_history_chart(chunks, m)}" for m in doc["metrics"])
    windows = "".join(f"<tr><td>{escape(name)}</td><td>{_interval(w['metrics'].get(m))}</td><td class=num>"
                      f"{w['labels']}</td><td class=num>{w['chunks']}</td><td>{escape(m)}</td></tr>"
                      for name, w in doc["windows"].items() for m in w["metrics"])
    last = doc["last_closed"]
    last_html = ("<p class=muted>no chunk has closed yet</p>" if last is None else
                 f"<p>{_span(last['chunk'])}: {_status(last['status'])}{' (final)' if last['final'] else ''}, "
                 f"{last['labels']} labels of {last['population']} items</p>"
                 + "".join(f"<p>{escape(m)}: {_interval(iv)}</p>" for m, iv in last["metrics"].items()))
    strata = "".join(f"<tr><td class=num>{s['stratum']}</td><td>{escape(s['side'])}</td><td class=num>"
                     f"{_num(s['lower_score'])}&ndash;{_num(s['upper_score'])}</td><td class=num>{s['items']}</td>"
                     f"<td class=num>{s['labels']}</td><td class=num>{_num(s['precision'])}</td></tr>"
                     for s in doc["strata"])
    body = (f"<p><a href=\"/\">&larr; all classifiers</a></p><h1>{cid}</h1>"
            f"<p>current chunk {_span(doc['chunk'])}: {_status(doc['status'])}, {doc['labels']} labels of "
            f"{doc['population']} items, {doc['pending']} pending, budget left {doc['label_budget_remaining']}"
            f"{_group_note(doc.get('review_group'))}</p>"
            f"<h2>windows</h2><table><tr><th>window</th><th>interval</th><th class=num>labels</th>"
            f"<th class=num>chunks</th><th>metric</th></tr>{windows}</table>"
            f"<h2>last closed chunk</h2>{last_html}{charts}"
            f"<h2>strata of the current chunk</h2><table><tr><th class=num>stratum</th><th>side</th>"
            f"<th class=num>scores</th><th class=num>items</th><th class=num>labels</th>"
            f"<th class=num>positive share</th></tr>{strata}</table>")
    return _html(f"stratameter: {cid}", body)


def random_sample_labels(estimate: float | None, delta: float, confidence: float) -> int | None:
    """Labels a simple random sample needs for a half-width of `delta` at the proportion `estimate`:
    ``z^2 p (1 - p) / delta^2`` (the normal interval of a proportion), at least 1."""
    if estimate is None:
        return None
    z = float(z_value(confidence))
    return max(1, math.ceil(z * z * estimate * (1 - estimate) / delta ** 2))


def _review_budgets(groups: list[dict]) -> str:
    """The "Review budgets" table: a row a group with a shared budget; nothing without one."""
    if not groups:
        return ""
    rows = "".join(f"<tr><td>{escape(g['group'])}</td><td class=num>{g['budget_per_hour']}</td>"
                   f"<td class=num>{g['granted_this_hour']}</td><td class=num>{g['remaining']}</td>"
                   f"<td>{_members(g['classifiers'])}</td></tr>" for g in groups)
    return ("<h2>Review budgets</h2><table><tr><th>group</th><th class=num>budget/h</th>"
            "<th class=num>granted this hour</th><th class=num>remaining</th><th>classifiers</th></tr>"
            f"{rows}</table>")


def _members(cids: list[str]) -> str:
    """A group's classifiers, linked, the first `GROUP_MEMBERS_LIMIT` of them."""
    links = ", ".join(_classifier_link(c) for c in cids[:GROUP_MEMBERS_LIMIT])
    more = len(cids) - GROUP_MEMBERS_LIMIT
    tail = f" <span class=muted>and {more} more</span>" if more > 0 else ""
    return (links or "<span class=muted>none yet</span>") + tail


def _classifier_link(cid: str) -> str:
    """A link to classifier `cid`'s page."""
    return f"<a href=\"/classifiers/{quote(cid, safe='')}\">{escape(cid)}</a>"


def _group_note(group: str | None) -> str:
    """The classifier page's mention of its review group (a shared budget it draws on too)."""
    return "" if group is None else f" (review group {escape(group)}: its shared budget holds too)"


def _overview_row(d: dict) -> str:
    window = next(iter(d["windows"].values()), None)
    window_html = "&ndash;" if window is None else _interval(window["metrics"].get("precision"))
    last = d["last_closed"]
    last_html = "&ndash;" if last is None else _interval(last["metrics"].get("precision"))
    need = random_sample_labels(d["estimate"], d["delta"], d["confidence"])
    cid = d["classifier_id"]
    return (f"<tr><td>{_classifier_link(cid)}</td><td>{window_html}</td>"
            f"<td>{last_html}</td><td>{_interval(d)}</td><td class=num>{d['labels']}</td>"
            f"<td class=num>{'&ndash;' if need is None else need}</td><td>{_status(d['status'])}</td>"
            f"<td class=num>{d['label_budget_remaining']}</td></tr>")


def _history_chart(chunks: list[dict], metric: str, width: int = 720, height: int = 160) -> str:
    """The metric's estimate (line) and interval (band) per held chunk, over time, as SVG."""
    points = [(rfc3339_to_ms(c["chunk"]["start"]) / 1000, c["metrics"].get(metric) or {}) for c in chunks
              if c["chunk"]]
    points = [(t, iv) for t, iv in points if iv.get("estimate") is not None]
    if not points:
        return "<p class=muted>no interval yet</p>"
    t0, t1 = points[0][0], max(points[-1][0], points[0][0] + 1)
    x = lambda t: 40 + (width - 50) * (t - t0) / (t1 - t0)  # noqa: E731
    y = lambda v: 10 + (height - 30) * (1 - v)  # noqa: E731
    upper = " ".join(f"{x(t):.1f},{y(iv['ci_upper']):.1f}" for t, iv in points)
    lower = " ".join(f"{x(t):.1f},{y(iv['ci_lower']):.1f}" for t, iv in reversed(points))
    line = " ".join(f"{x(t):.1f},{y(iv['estimate']):.1f}" for t, iv in points)
    ticks = "".join(f"<text x=4 y={y(v) + 4:.1f}>{v:.1f}</text>" for v in (0.0, 0.5, 1.0))
    return (f"<svg width={width} height={height} role=img aria-label=\"{escape(metric)} over time\">{ticks}"
            f"<polygon points=\"{upper} {lower}\" fill=\"#9bd\" fill-opacity=\"0.5\"/>"
            f"<polyline points=\"{line}\" fill=none stroke=\"#136\" stroke-width=2/>"
            f"<text x=40 y={height - 4}>{escape(_clock(t0))}</text>"
            f"<text x={width - 130} y={height - 4}>{escape(_clock(t1))}</text></svg>")


def _interval(iv: dict | None) -> str:
    if not iv or iv.get("estimate") is None:
        return "<span class=muted>no interval yet</span>"
    return f"{iv['estimate']:.3f} <span class=muted>[{iv['ci_lower']:.3f}, {iv['ci_upper']:.3f}]</span>"


def _status(status: str) -> str:
    return f"<span class=\"status {escape(status)}\">{escape(status)}</span>"


def _span(chunk: dict | None) -> str:
    return "&ndash;" if not chunk else f"{escape(chunk['start'])} &ndash; {escape(chunk['end'])}"


def _num(x) -> str:
    return "&ndash;" if x is None else f"{x:.3g}"


def _clock(seconds: float) -> str:
    return format_time(round(seconds * 1000))


def _html(title: str, body: str) -> str:
    return (f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{escape(title)}</title>"
            f"<meta name=viewport content=\"width=device-width\"><style>{_STYLE}</style></head>"
            f"<body>{body}</body></html>")
