"""12-factor configuration: ``STRATAMETER_*`` environment variables (pydantic-settings).

`load_settings()` reads the environment (or a given mapping) and raises `ConfigError` naming the
variable on any wrong value, e.g. ``STRATAMETER_DELTA: must be in (0, 0.5), got 2``.  Variable names
are upper case; an empty value counts as unset.  The variables, their defaults and what they do:
docs/reference/configuration.md, held to the declarations by tests/unit/test_config_docs.py.

Every setting is declared once, as a field of `Settings` (`settings.py`) with its check (`checks.py`)
in its ``Annotated[...]``.  Secrets (`KAFKA_SASL_PASSWORD`, `REDIS_PASSWORD`, the Label Studio bridge's
`LABEL_STUDIO_TOKEN`, and for convenience the two user names) may instead come from a mounted file named by the ``*_FILE`` variant
(``STRATAMETER_REDIS_PASSWORD_FILE=/run/secrets/redis``; one trailing newline is dropped; `source.py`).
Passwords are `SecretStr`: masked in repr, str and `Settings.safe_dict()`, which also masks a password
inside ``REDIS_URL`` (`clients.py`).

Per-classifier overrides come from the JSON file named by ``STRATAMETER_CLASSIFIERS_CONFIG_FILE``
(`overrides.py`), with the review groups sharing a label budget under its reserved key ``$review_groups``::

    {"$review_groups": {"trust-safety": {"budget_per_hour": 2000}},
     "fraud-v3": {"threshold": 0.7, "delta": 0.01, "max_labels_per_hour": 200, "review_group": "trust-safety"}}

validated by the same checks as the variables (unknown keys are rejected);
`Settings.for_classifier(cid)` returns the effective `ClassifierConfig`, a model derived from the
fields marked per classifier.  `Settings.review_budgets` maps each group with a shared budget to its
labels per hour (``default``'s is ``STRATAMETER_REVIEW_BUDGET_PER_HOUR``), and `Settings.group_of(cid)`
names the group classifier `cid` draws on (None: its own ``MAX_LABELS_PER_HOUR`` alone holds).
"""

from .checks import ENV_PREFIX, ConfigError, Mark, env_var, mask_url
from .settings import (
    FILE_SECRETS,
    LOG_LEVELS,
    OVERRIDABLE,
    PER_CLASSIFIER,
    SASL_MECHANISMS,
    SECURITY_PROTOCOLS,
    ClassifierConfig,
    Settings,
    load_settings,
)

__all__ = [
    "ENV_PREFIX", "FILE_SECRETS", "LOG_LEVELS", "OVERRIDABLE", "PER_CLASSIFIER", "SASL_MECHANISMS",
    "SECURITY_PROTOCOLS", "ClassifierConfig", "ConfigError", "Mark", "Settings", "env_var", "load_settings",
    "mask_url",
]
