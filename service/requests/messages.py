"""The label-requests records the request loop publishes (`stratameter.label-requests`, the contract
`schemas.messages.LabelRequest`), and their ids."""

from __future__ import annotations

import secrets

from stratameter.schemas.outbound import label_request_bytes


def new_request_id(state_id: str) -> str:
    return f"{state_id}/{secrets.token_urlsafe(16)}"


def request_message(rid: str, cid: str, stratum: int, member: dict, requested_ms: int, deadline_ms: int,
                    predicted_positive: bool = True) -> bytes:
    """A `stratameter.label-requests` record (the contract: schemas.messages.LabelRequest)."""
    return label_request_bytes(rid, cid, member["i"], member["s"], stratum, requested_ms / 1000, deadline_ms / 1000,
                               member.get("x"), predicted_positive)
