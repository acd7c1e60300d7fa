"""The file named by ``STRATAMETER_CLASSIFIERS_CONFIG_FILE``: per-classifier overrides and review groups.

One JSON object.  Each key is a classifier id; its object overrides, for that classifier, the settings
marked OVERRIDE (docs/reference/configuration.md's ``*``), checked by the same checks as the variables,
strictly (``"0.7"`` is not a number).  The reserved key ``"$review_groups"`` (``$`` is no classifier-id
character, so it cannot name a classifier) defines the review groups, each with the hourly label budget
its classifiers share (`GROUP_KEYS`: ``budget_per_hour``, an integer >= 1, and optionally ``share_items``, a
boolean: one label request serves every member that wants the item, `requests.shared_items`)::

    {"$review_groups": {"trust-safety": {"budget_per_hour": 2000, "share_items": true},
                        "ads": {"budget_per_hour": 300}},
     "spam-en": {"review_group": "trust-safety", "review_weight": 1.5, "delta": 0.02},
     "fraud": {"review_group": "trust-safety"}}

A group's name follows the classifier-id rule: it ends up in Redis key hash tags and metric labels.
Every classifier is in the group ``STRATAMETER_REVIEW_GROUP`` (``default`` unless set) unless its own
``review_group`` says otherwise; a group other than ``default`` must be defined here.  The budget of
``default`` is ``STRATAMETER_REVIEW_BUDGET_PER_HOUR``, or, when that is 0, a ``default`` entry here
(both at once is an error); without either it has none, and its classifiers keep only their own
``MAX_LABELS_PER_HOUR``.  A classifier in a group with a budget draws on both: a request needs room in
its group's budget and in its own ``MAX_LABELS_PER_HOUR``.

`load_classifiers_file` reads the file and `review_budgets` applies the rules that tie it to the
variables.  Their errors are `ConfigError` lines naming the place, e.g.
``STRATAMETER_CLASSIFIERS_CONFIG_FILE: $review_groups.ads.budget_per_hour: must be >= 1, got 0`` or
``STRATAMETER_CLASSIFIERS_CONFIG_FILE: spam-en.review_group: no group 'x' (defined: trust-safety, ads)``;
all of a file's errors are reported at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import orjson
from pydantic import BaseModel, TypeAdapter, ValidationError

from stratameter.schemas.messages import CLASSIFIER_ID_RULE, is_classifier_id

from .checks import ConfigError, env_var, field_errors, in_range

#: the reserved top-level key of the review groups
GROUPS_KEY = "$review_groups"
#: the group of every classifier that names none (nor does STRATAMETER_REVIEW_GROUP)
DEFAULT_GROUP = "default"
#: the keys of a group's object
GROUP_KEYS: tuple[str, ...] = ("budget_per_hour", "share_items")

_VAR = env_var("classifiers_config_file")
_BUDGET: TypeAdapter[int] = TypeAdapter(Annotated[int, in_range(1)])


@dataclass(frozen=True)
class ClassifiersFile:
    """What the file says: the effective `ClassifierConfig` of each classifier it names, the
    ``budget_per_hour`` of each group under ``$review_groups``, and the groups that share items."""

    overrides: dict[str, BaseModel] = field(default_factory=dict)
    groups: dict[str, int] = field(default_factory=dict)
    sharing: frozenset[str] = frozenset()


def load_classifiers_file(path: Path, defaults: BaseModel, overridable: tuple[str, ...]) -> ClassifiersFile:
    """The file at `path`: each classifier's overrides applied to `defaults` (a `ClassifierConfig`; the
    keys allowed are `overridable`), and the groups.  Raises `ConfigError` with every error of the file."""
    doc = _read(path)
    errors: list[str] = []
    raw_groups = doc.pop(GROUPS_KEY, {})
    groups, named = _groups(raw_groups, errors)
    base = defaults.model_dump(exclude={"classifier_id"})
    overrides: dict[str, BaseModel] = {}
    for cid, over in doc.items():
        cfg = _classifier(cid, over, base, type(defaults), overridable, errors)
        if cfg is not None:
            overrides[cid] = cfg
        # its own group (one inherited from STRATAMETER_REVIEW_GROUP is `review_budgets`'), reported
        # along with its other errors; a group that is no name at all is its check's
        group = over.get("review_group") if is_classifier_id(cid) and isinstance(over, dict) else None
        if is_classifier_id(group) and group != DEFAULT_GROUP and group not in named:
            errors.append(f"{cid}.review_group: {_no_group(group, named)}")
    if errors:
        raise ConfigError([(_VAR, message) for message in errors])
    return ClassifiersFile(overrides, groups, frozenset(g for g in groups if raw_groups[g].get("share_items")))


def review_budgets(groups: dict[str, int], budget_per_hour: int, review_group: str) -> dict[str, int]:
    """Every group with a shared budget and its labels per hour: the file's `groups`, and ``default``
    with `budget_per_hour` (STRATAMETER_REVIEW_BUDGET_PER_HOUR) when that is above 0.  Raises `ConfigError`
    when `review_group` (STRATAMETER_REVIEW_GROUP) names a group not defined, or when both the variable
    and the file set the budget of ``default``."""
    errors: list[tuple[str, str]] = []
    if review_group != DEFAULT_GROUP and review_group not in groups:
        errors.append((env_var("review_group"), _no_group(review_group, groups)))
    budgets = dict(groups)
    if budget_per_hour > 0:
        if DEFAULT_GROUP in groups:
            errors.append((_VAR, f"{GROUPS_KEY}.{DEFAULT_GROUP}: the budget of the group {DEFAULT_GROUP!r} is "
                                 f"{env_var('review_budget_per_hour')} ({budget_per_hour}) as well as "
                                 f"{GROUPS_KEY}.{DEFAULT_GROUP}.budget_per_hour here "
                                 f"({groups[DEFAULT_GROUP]}); set it in one place"))
        budgets = {DEFAULT_GROUP: budget_per_hour, **groups}
    if errors:
        raise ConfigError(errors)
    return budgets


def _read(path: Path) -> dict[str, Any]:
    try:
        doc = orjson.loads(path.read_bytes())
    except OSError as exc:
        raise ConfigError([(_VAR, f"cannot read {str(path)!r}: {exc.strerror or exc}")]) from None
    except orjson.JSONDecodeError as exc:
        raise ConfigError([(_VAR, f"{str(path)!r} is not valid JSON: {exc}")]) from None
    if not isinstance(doc, dict):
        raise ConfigError([(_VAR, f"{str(path)!r} must hold a JSON object "
                                  '{"<classifier_id>": {"<setting>": value, ...}, ...} (and optionally '
                                  f'"{GROUPS_KEY}": {{"<group>": {{"budget_per_hour": n}}, ...}})')])
    return doc


def _groups(doc: Any, errors: list[str]) -> tuple[dict[str, int], list[str]]:
    """The valid groups of ``$review_groups`` with their budgets, and the names it defines (the valid
    ones and those with a wrong object: a classifier naming one is not reported as well)."""
    if not isinstance(doc, dict):
        errors.append(f'{GROUPS_KEY}: must be an object {{"<group>": {{"budget_per_hour": n}}, ...}}, '
                      f"got {type(doc).__name__}")
        return {}, []
    groups: dict[str, int] = {}
    named: list[str] = []
    for name, group in doc.items():
        where = f"{GROUPS_KEY}.{name}"
        if not is_classifier_id(name):
            errors.append(f"{GROUPS_KEY}: {name!r} is not a group name ({CLASSIFIER_ID_RULE}, the classifier-id "
                          "rule)")
            continue
        named.append(name)
        if not isinstance(group, dict):
            errors.append(f'{where}: must be an object {{"budget_per_hour": n}}, got {type(group).__name__}')
        elif set(group) - set(GROUP_KEYS):
            errors.append(f"{where}: unknown key(s) {', '.join(map(repr, sorted(set(group) - set(GROUP_KEYS))))}; "
                          f"allowed: {', '.join(GROUP_KEYS)}")
        elif "budget_per_hour" not in group:
            errors.append(f"{where}.budget_per_hour: required (the group's labels per hour, >= 1)")
        elif not isinstance(group.get("share_items", False), bool):
            errors.append(f"{where}.share_items: must be true or false, got {group['share_items']!r}")
        else:
            try:
                groups[name] = _BUDGET.validate_python(group["budget_per_hour"], strict=True)
            except ValidationError as exc:
                errors.extend(f"{where}.budget_per_hour: {msg}" for _, msg in field_errors(exc, str, lambda f: False))
    return groups, named


def _classifier(cid: str, over: Any, base: dict[str, Any], model: type[BaseModel], overridable: tuple[str, ...],
                errors: list[str]) -> BaseModel | None:
    """Classifier `cid`'s `ClassifierConfig`: `base` with its overrides `over` (None, and `errors`
    extended, when they are wrong)."""
    if not is_classifier_id(cid):
        reserved = f"; the only reserved key is {GROUPS_KEY!r}" if cid.startswith("$") else ""
        errors.append(f"{cid!r} is not a classifier id ({CLASSIFIER_ID_RULE}){reserved}")
        return None
    if not isinstance(over, dict):
        errors.append(f"{cid}: must be an object of settings, got {type(over).__name__}")
        return None
    unknown = sorted(set(over) - set(overridable))
    if unknown:
        errors.append(f"{cid}: unknown setting(s) {', '.join(map(repr, unknown))}; allowed: {', '.join(overridable)}")
        return None
    try:
        return model.model_validate({**base, **over, "classifier_id": cid}, strict=True)
    except ValidationError as exc:
        errors.extend(f"{cid}.{name}: {msg}" for name, msg in field_errors(exc, lambda f: f, lambda f: False))
        return None


def _no_group(group: str, defined: Any) -> str:
    names = ", ".join(defined) or f"none; groups are defined under {GROUPS_KEY!r} in {_VAR}"
    return f"no group {group!r} (defined: {names})"
