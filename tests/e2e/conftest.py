"""The end-to-end tests' own fixture: a real Label Studio, started once a session on first use."""

from tests.label_studio_harness import label_studio  # noqa: F401  (registered for this folder)
