"""`api.page`: the status page rendered from API documents, by hand: what it lists, escaping, and
the labels a simple random sample would need."""

from __future__ import annotations

import math

from stratameter.api.page import classifier_page, overview_page, random_sample_labels

IV = {"estimate": 0.9, "ci_lower": 0.85, "ci_upper": 0.94, "stderr": 0.02}


def _doc(cid="fraud<1>", **over):
    chunk = {"start": "2026-12-06T10:00:00.000Z", "end": "2026-12-06T11:00:00.000Z"}
    doc = {"classifier_id": cid, "confidence": 0.95, "delta": 0.02, "estimate": 0.9, "ci_lower": 0.85,
           "ci_upper": 0.94, "stderr": 0.02, "metrics": {"precision": IV}, "labels": 120, "population": 5000,
           "status": "open", "pending": 3, "label_budget_remaining": 40, "chunk": chunk,
           "strata": [{"stratum": 0, "side": "positive", "lower_score": 0.5, "upper_score": 0.7, "items": 900,
                       "labels": 30, "positives": 20, "precision": 2 / 3}],
           "windows": {"1d": {"start": None, "end": None, "chunks": 24, "population": 120000, "labels": 2000,
                              "complete": True, "incomplete_chunks": [], "metrics": {"precision": IV}}},
           "last_closed": {"chunk": chunk, "status": "converged", "final": True, "labels": 400,
                           "population": 5000, "metrics": {"precision": IV}},
           "history": [{"chunk": {"start": "2026-12-06T09:00:00.000Z", "end": "2026-12-06T10:00:00.000Z"},
                        "metrics": {"precision": {**IV, "estimate": 0.88}}}]}
    doc.update(over)
    return doc


def test_random_sample_labels_is_the_closed_form():
    z = 1.959963984540054
    assert random_sample_labels(0.9, 0.02, 0.95) == math.ceil(z * z * 0.09 / 0.0004)  # 865
    assert random_sample_labels(None, 0.02, 0.95) is None and random_sample_labels(1.0, 0.02, 0.95) == 1


def test_the_overview_lists_each_classifier_with_its_window_last_closed_and_current_chunk():
    html = overview_page([_doc(), _doc("b", windows={}, last_closed=None, estimate=None)], total=3)
    assert "fraud&lt;1&gt;" in html and "<1>" not in html  # escaped
    assert 'href="/classifiers/fraud%3C1%3E"' in html
    assert html.count("0.900 <span class=muted>[0.850, 0.940]</span>") == 3  # window, last closed, current
    assert ">865<" in html and "1 more classifiers" in html and "no interval yet" in html


def test_the_classifier_page_draws_the_history_and_lists_windows_and_strata():
    html = classifier_page(_doc())
    assert html.count("<svg") == 1 and "<polygon" in html and "<polyline" in html
    assert "1d" in html and "(final)" in html and "900" in html and "0.667" in html


def test_a_classifier_without_intervals_renders():
    assert "no interval yet" in classifier_page(_doc(metrics={"precision": {"estimate": None, "ci_lower": None,
                                                                             "ci_upper": None, "stderr": None}},
                                                     history=[]))


def test_the_review_budgets_table_shows_only_when_a_group_has_a_budget():
    assert "Review budgets" not in overview_page([_doc()], total=1)
    team = {"group": "team<x>", "budget_per_hour": 3600, "allowed_now": 1980, "granted_this_hour": 500,
            "remaining": 1480, "classifiers": ["a", "fraud<1>"]}
    html = overview_page([_doc()], total=1, groups=[team])
    assert "<h2>Review budgets</h2>" in html and "team&lt;x&gt;" in html and "<x>" not in html
    assert ">3600<" in html and ">500<" in html and ">1480<" in html
    assert 'href="/classifiers/fraud%3C1%3E">fraud&lt;1&gt;</a>' in html
    many = overview_page([_doc()], total=1, groups=[{**team, "classifiers": [f"c{i}" for i in range(25)]}])
    assert "c19" in many and "c20<" not in many and "and 5 more" in many
    assert "none yet" in overview_page([_doc()], total=1, groups=[{**team, "classifiers": []}])


def test_the_classifier_page_names_its_review_group():
    assert "review group" not in classifier_page(_doc())
    assert "review group team" in classifier_page(_doc(review_group="team"))
