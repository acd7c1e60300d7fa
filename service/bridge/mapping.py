"""What the bridge writes into Label Studio and reads back: pure functions, no I/O.

* `task_payload`: a `LabelRequest` -> a task's ``data`` and ``meta``.  The context's fields become
  the task's data (a labelling config of your own can show them as ``$field``); the default
  config shows `VIEW_FIELD`, a table of the item id and the context, under `QUESTION_FIELD`.  The
  score is left out unless asked for (it anchors the reviewer's judgement).  The meta carries
  ``request_id``, ``classifier_id``, ``item_id``, ``requested_at`` and ``expires_at``.
* `label_config`: the labelling config of a project the bridge creates.
* `Choices` and `answer_label`: a reviewer's annotation -> the label (True, False, None).
* `webhook_events`: a webhook body -> ``(action, task id)`` pairs, or `BadWebhook` with a reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from xml.sax.saxutils import quoteattr

import orjson

from stratameter.schemas.messages import MAX_REQUEST_ID_CHARS, LabelRequest, is_classifier_id

QUESTION_FIELD = "stratameter_question"
VIEW_FIELD = "stratameter_item"
#: the name of the default config's choices control (a config of your own may use any name)
CONTROL = "label"
#: task meta keys the bridge writes (the request's identity and deadline)
META_KEYS = ("request_id", "classifier_id", "item_id", "requested_at", "expires_at")
#: the webhook actions the bridge registers
ACTIONS = ("ANNOTATION_CREATED", "ANNOTATION_UPDATED")
#: the webhook actions whose body names annotations (single, or a list for the bulk one)
ANNOTATION_ACTIONS = ("ANNOTATION_CREATED", "ANNOTATIONS_CREATED", "ANNOTATION_UPDATED")


@dataclass(frozen=True)
class Choices:
    """The choice names that mean a true label, a false one and (optionally) unsure
    (``STRATAMETER_LABEL_STUDIO_CHOICES``, e.g. ``Positive,Negative,Unsure``)."""

    true: str
    false: str
    unsure: str | None = None

    @classmethod
    def parse(cls, text: str) -> "Choices":
        names = [n.strip() for n in text.split(",")]
        return cls(names[0], names[1], names[2] if len(names) > 2 else None)

    @property
    def names(self) -> tuple[str, ...]:
        return (self.true, self.false) + ((self.unsure,) if self.unsure else ())

    def label_of(self, name: str) -> bool | None:
        """True, False or None for a known choice; KeyError for any other."""
        return {self.true: True, self.false: False, **({self.unsure: None} if self.unsure else {})}[name]


class UnknownChoice(ValueError):
    """An annotation whose choice is none of the configured ones (the project's config differs)."""


def label_config(choices: Choices) -> str:
    """The labelling config of a project the bridge creates: the question, the item as a table, one
    required choice (hotkeys 1, 2, 3); skipping stays possible (a skip is sent as ``label: null``)."""
    options = "\n".join(f"    <Choice value={quoteattr(name)} hotkey=\"{i}\"/>" for i, name in enumerate(choices.names, 1))
    return (f"<View>\n  <Header value=\"${QUESTION_FIELD}\"/>\n  <Table name=\"item\" value=\"${VIEW_FIELD}\"/>\n"
            f"  <Choices name=\"{CONTROL}\" toName=\"item\" choice=\"single-radio\" showInline=\"true\" required=\"true\">\n"
            f"{options}\n  </Choices>\n</View>")


def config_choices(project: dict) -> set[str]:
    """The choice values of every Choices control of a project (from its ``parsed_label_config``)."""
    parsed = project.get("parsed_label_config") or {}
    out: set[str] = set()
    for control in parsed.values() if isinstance(parsed, dict) else ():
        if isinstance(control, dict) and control.get("type") == "Choices":
            out.update(str(x) for x in control.get("labels") or ())
    return out


def _shown(value: Any) -> Any:
    """A context value as the table cell shows it: scalars as they are, anything else as compact JSON."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return orjson.dumps(value).decode()


def task_payload(request: LabelRequest, show_score: bool = False) -> tuple[dict, dict]:
    """``(data, meta)`` of the task for `request`.  Without a context the reviewer still sees the item
    id (and the score when `show_score`)."""
    context = dict(request.context or {})
    view: dict[str, Any] = {"item_id": request.item_id}
    for key, value in context.items():
        view.setdefault(str(key), _shown(value))
    data: dict[str, Any] = {**context}
    if show_score:
        view["score"] = request.score
        data["score"] = request.score
    data[QUESTION_FIELD] = f"Is this item positive for {request.classifier_id}?"
    data[VIEW_FIELD] = view
    data.setdefault("item_id", request.item_id)
    meta = {key: getattr(request, key) for key in META_KEYS}
    return data, meta


@dataclass(frozen=True)
class TaskRequest:
    """The request a task answers, read back from its meta: None unless the bridge made it."""

    request_id: str
    classifier_id: str

    @classmethod
    def of(cls, task: dict) -> "TaskRequest | None":
        meta = task.get("meta")
        if not isinstance(meta, dict):
            return None
        rid, cid = meta.get("request_id"), meta.get("classifier_id")
        if not (isinstance(rid, str) and 0 < len(rid) <= MAX_REQUEST_ID_CHARS and is_classifier_id(cid)):
            return None
        return cls(rid, cid)


def first_annotation(task: dict) -> dict | None:
    """The task's first annotation (lowest id): the answer; later ones cannot change the estimate."""
    annotations = [a for a in task.get("annotations") or () if isinstance(a, dict) and isinstance(a.get("id"), int)]
    return min(annotations, key=lambda a: a["id"]) if annotations else None


def answer_label(annotation: dict, choices: Choices) -> bool | None:
    """The label an annotation gives: True / False for the true / false choice; None for the unsure
    choice, a skipped (cancelled) annotation, no choice at all, or contradicting choices.  Raises
    `UnknownChoice` when it picked only names that are none of `choices`."""
    if annotation.get("was_cancelled"):
        return None
    picked: list[str] = []
    for region in annotation.get("result") or ():
        value = region.get("value") if isinstance(region, dict) else None
        names = value.get("choices") if isinstance(value, dict) else None
        if isinstance(names, list):
            picked += [n for n in names if isinstance(n, str)]
    known = {choices.label_of(n) for n in picked if n in choices.names}
    if picked and not known:
        raise UnknownChoice(f"choice(s) {sorted(set(picked))} are none of {list(choices.names)} "
                            "(STRATAMETER_LABEL_STUDIO_CHOICES)")
    return known.pop() if len(known) == 1 else None


class BadWebhook(ValueError):
    """A webhook body the bridge cannot use; `reason` is the counter's label."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


#: the reasons of `BadWebhook` (the label values of stratameter_bridge_webhook_errors_total)
WEBHOOK_ERRORS = ("bad_request", "too_large", "invalid_json", "not_object", "no_action", "bad_annotation")


def _task_id(annotation: Any, body: dict) -> int | None:
    if not isinstance(annotation, dict):
        return None
    task = annotation.get("task")
    if isinstance(task, dict):
        task = task.get("id")
    if task is None and isinstance(body.get("task"), dict):
        task = body["task"].get("id")
    return task if isinstance(task, int) and not isinstance(task, bool) and task > 0 else None


def webhook_events(raw: bytes) -> tuple[str, list[int]]:
    """``(action, task ids)`` of a Label Studio webhook body.  The body only says which tasks to look
    at: the bridge reads each task back from Label Studio, so a forged body cannot make a label.
    Raises `BadWebhook` when the body is not a Label Studio webhook."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadWebhook("invalid_json", f"the body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadWebhook("not_object", f"the body is JSON but not an object ({type(body).__name__})")
    action = body.get("action")
    if not isinstance(action, str) or not action:
        raise BadWebhook("no_action", "the body has no \"action\" string")
    if action not in ANNOTATION_ACTIONS:
        return action, []
    annotations = body.get("annotation")
    many = annotations if isinstance(annotations, list) else [annotations]
    ids = [_task_id(a, body) for a in many]
    if not ids or any(t is None for t in ids):
        raise BadWebhook("bad_annotation", f"{action}: \"annotation\" must be an object with a \"task\" id")
    return action, list(dict.fromkeys(t for t in ids if t is not None))
