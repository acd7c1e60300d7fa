"""The bridge's start-up checks, each ending the start with a `StartupError` naming the setting
(`require_token`, before any connection, a `ConfigError`): Label Studio answers and takes the token,
the project exists (an id) or is found or created (a title) and has the configured choices, its
webhook points at STRATAMETER_LABEL_STUDIO_WEBHOOK_URL, and Kafka's clients start."""

from __future__ import annotations

import logging

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import KafkaError

from ..config import ConfigError, Settings, env_var
from ..errors import StartupError, kafka_startup_error
from . import mapping
from .client import LabelStudio, LabelStudioError
from .context import Context
from .intake import BATCH_RECORDS
from .mapping import Choices

log = logging.getLogger(__name__)

PROJECT_DESCRIPTION = ("Items stratameter chose for review (stratameter bridge label-studio). The first answer "
                       "per task counts; Skip sends 'cannot tell'.")


def require_token(settings: Settings) -> None:
    """`ConfigError` naming STRATAMETER_LABEL_STUDIO_TOKEN when it is not set (the service does not need it)."""
    if settings.label_studio_token is None:
        raise ConfigError([(env_var("label_studio_token"), "required by `stratameter bridge label-studio`: an API "
                            "token of the Label Studio user the bridge acts as (Label Studio: Account & Settings), "
                            "or STRATAMETER_LABEL_STUDIO_TOKEN_FILE naming a file holding it")])


async def check_label_studio(ls: LabelStudio, url: str) -> None:
    try:
        await ls.whoami()
    except LabelStudioError as exc:
        if exc.status in (401, 403):
            raise StartupError(
                f"Label Studio at {url} refused the token (STRATAMETER_LABEL_STUDIO_TOKEN): {exc}. Use a "
                "personal access token, or a legacy token with LABEL_STUDIO_ENABLE_LEGACY_API_TOKEN=true on "
                "Label Studio (Account & Settings shows both)") from None
        if exc.status == 0:
            raise StartupError(f"cannot reach Label Studio at {url} (STRATAMETER_LABEL_STUDIO_URL): {exc}") from None
        raise StartupError(f"STRATAMETER_LABEL_STUDIO_URL: {url} does not answer as Label Studio: {exc}") from None


async def ensure_project(ctx: Context) -> None:
    """Find the project (an id, or a title: created with `mapping.label_config` when absent), set
    `ctx.project_id` and `project_title`, and check that its config has the configured choices."""
    wanted = ctx.settings.label_studio_project
    try:
        if wanted.isdigit():
            doc = await _project_by_id(ctx.ls, ctx.settings.label_studio_url, int(wanted))
        else:
            doc = await _project_titled(ctx.ls, wanted, ctx.choices)
    except LabelStudioError as exc:
        raise StartupError(f"STRATAMETER_LABEL_STUDIO_PROJECT: cannot find or create the project {wanted!r}: "
                           f"{exc}") from None
    ctx.project_id, ctx.project_title = int(doc["id"]), str(doc.get("title", ""))
    have = mapping.config_choices(doc)
    missing = [c for c in ctx.choices.names if c not in have]
    if missing:
        raise StartupError(
            f"STRATAMETER_LABEL_STUDIO_CHOICES: the project {ctx.project_title!r} (id {ctx.project_id}) has "
            f"no choice {', '.join(map(repr, missing))} in its labelling config (its choices: "
            f"{', '.join(sorted(have)) or 'none'}); name its choices for true, false and optionally unsure")


async def _project_by_id(ls: LabelStudio, url: str, project_id: int) -> dict:
    doc = await ls.project(project_id)
    if doc is None:
        raise StartupError(f"STRATAMETER_LABEL_STUDIO_PROJECT: Label Studio at {url} has no project with id "
                           f"{project_id}")
    return doc


async def _project_titled(ls: LabelStudio, title: str, choices: Choices) -> dict:
    """The first project titled `title`, created when there is none (one, when replicas start at once)."""
    found = await ls.projects_titled(title)
    if not found:
        created = await ls.create_project(title, mapping.label_config(choices), PROJECT_DESCRIPTION)
        found = await ls.projects_titled(title) or [created]
        if found[0]["id"] != created["id"]:  # another replica created it at the same moment
            await ls.delete_project(created["id"])
        else:
            log.info("created the Label Studio project %r (id %d)", title, created["id"])
    elif len(found) > 1:
        log.warning("Label Studio has %d projects titled %r: using the first, id %d", len(found), title,
                    found[0]["id"])
    return await ls.project(found[0]["id"]) or found[0]


async def ensure_webhook(ctx: Context) -> None:
    """The project's webhook to STRATAMETER_LABEL_STUDIO_WEBHOOK_URL (one; the actions the bridge
    needs).  Without that setting the bridge polls only."""
    url, ls, project = ctx.settings.label_studio_webhook_url, ctx.ls, ctx.project_id
    if url is None:
        log.info("STRATAMETER_LABEL_STUDIO_WEBHOOK_URL is not set: answers come by polling only, every %g s",
                 ctx.settings.label_studio_poll_seconds)
        return
    actions = list(mapping.ACTIONS)
    try:
        hooks = [h for h in await ls.webhooks(project) if h.get("url") == url]
        if not hooks:
            await ls.create_webhook(project, url, actions)
            hooks = [h for h in await ls.webhooks(project) if h.get("url") == url]
        for extra in hooks[1:]:  # replicas starting at once each created one
            await ls.delete_webhook(extra["id"])
        hook = hooks[0]
        if sorted(hook.get("actions") or ()) != sorted(actions) or not hook.get("is_active") \
                or not hook.get("send_payload"):
            await ls.update_webhook(hook["id"], actions)
    except (LabelStudioError, KeyError, IndexError) as exc:
        raise StartupError(f"STRATAMETER_LABEL_STUDIO_WEBHOOK_URL: cannot register the webhook {url} in the "
                           f"project {project}: {exc}") from None


async def start_kafka(ctx: Context) -> None:
    """The producer (labels) and the consumer of label requests (the bridge's own group, manual
    commits), set on `ctx` as they are made, so that a failed start still closes what was made."""
    s = ctx.settings
    kafka = s.kafka_client_kwargs()
    try:
        ctx.producer = AIOKafkaProducer(acks="all", linger_ms=5, enable_idempotence=False, **kafka)
        await ctx.producer.start()
        ctx.consumer = AIOKafkaConsumer(
            s.topic_label_requests, group_id=s.bridge_consumer_group, enable_auto_commit=False,
            auto_offset_reset="earliest", session_timeout_ms=s.kafka_session_timeout_ms,
            heartbeat_interval_ms=500, max_poll_records=BATCH_RECORDS, **kafka)
        await ctx.consumer.start()
    except KafkaError as exc:
        raise kafka_startup_error(s, exc) from None
