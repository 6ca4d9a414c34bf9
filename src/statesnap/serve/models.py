"""The JSON answers' typed models and the error answers each route may give: what the OpenAPI
document shows (the routes build their bodies as plain dicts, for speed, in these shapes)."""

from typing import Any

from pydantic import BaseModel, Field

__all__ = ["ERROR_RESPONSES", "HealthModel", "Item", "Problem", "ScanPage", "StatusModel"]


class Item(BaseModel):
    """One row; text fields are UTF-8, the ``*_b64`` variant is used when the bytes are not."""

    key: str | None = Field(None, description="The key as UTF-8 text.")
    key_b64: str | None = Field(None, description="The key, base64, when it is not valid UTF-8.")
    value: str | None = Field(None, description="The value as UTF-8 text.")
    value_b64: str | None = Field(None, description="The value, base64, when it is not valid UTF-8.")


class ScanPage(BaseModel):
    table: str
    items: list[Item]
    next: str | None = Field(
        description="Relative URL of the next page (same limit), or null on the last page."
    )


class Problem(BaseModel):
    detail: Any = Field(description="What went wrong.")


class StatusModel(BaseModel):
    table: str
    topic: str
    state: str = Field(description="restoring, running, failed or closed")
    ready: bool
    caught_up: bool
    offsets: dict[str, int] = Field(description="Partition → next offset to consume.")
    lag: dict[str, int] = Field(description="Partition → records behind (estimate unless 0).")
    total_lag: int
    keys: int
    checkpoint_generation: int | None = Field(description="Checkpoint booted from; null after full replay.")
    restore_seconds: float | None
    replayed_records: int
    last_update_age: float | None = Field(description="Seconds since a record was last applied.")
    newest_record_age: float | None = Field(description="Seconds since the newest record's timestamp.")
    error: str | None


class HealthModel(StatusModel):
    status: str = Field(description="ok when ready, else the state")


#: The error answers of the reads (``responses=`` of a route), by status.
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {
        "model": Problem,
        "description": "Malformed or out-of-range parameter (e.g. min_offsets, limit).",
    },
    404: {
        "model": Problem,
        "description": "No such table on this server, no such key, or no such generation (the "
        "answer lists the generations there are).",
    },
    500: {"model": Problem, "description": "The generation asked for does not verify (corrupt)."},
    503: {
        "model": Problem,
        "description": "The replica is still restoring (or failed), too many requests wait, or a "
        "generation could not be loaded for now (store or cluster unreachable).",
    },
    504: {
        "model": Problem,
        "description": "min_offsets / caught_up not reached, or the generation not loaded, within wait_ms.",
    },
}
