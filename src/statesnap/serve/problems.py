"""How the API answers what goes wrong: bad input is a 400 with the reason on one line (never
FastAPI's 422, in the answers or in the OpenAPI document), a replica not ready or failed a 503
with ``Retry-After``, a generation still loading a 504."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse

from statesnap.errors import ConfigError, StatesnapError, TableStateError
from statesnap.redaction import scrub
from statesnap.serve.generations import GenerationLoadTimeoutError

__all__ = ["answer_problems"]


def _validation_detail(exc: RequestValidationError) -> str:
    """FastAPI's validation errors as one line: ``wait_ms: Input should be less than or equal to …``."""
    parts = []
    for err in exc.errors():
        loc = [str(x) for x in err.get("loc", ()) if x not in ("query", "path", "header")]
        parts.append(f"{'.'.join(loc) or 'request'}: {err.get('msg', 'invalid')}")
    return "; ".join(parts) or "invalid request"


def _validation_errors(exc: RequestValidationError) -> list[Any]:
    """pydantic's errors without the ``input`` each one echoes: a 5000-digit ``wait_ms`` came back
    whole (and an int of that size cannot even be JSON-encoded); the type, location and message say
    what is wrong."""
    return [
        jsonable_encoder({k: v for k, v in err.items() if k in ("type", "loc", "msg", "ctx")})
        for err in exc.errors()
    ]


def _without_422(spec: dict[str, Any]) -> dict[str, Any]:
    """The OpenAPI document without FastAPI's generated 422 answers: this API answers 400."""
    for methods in spec.get("paths", {}).values():
        for op in methods.values():
            if isinstance(op, dict):
                op.get("responses", {}).pop("422", None)
    schemas = spec.get("components", {}).get("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    return spec


async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
    body = {"detail": _validation_detail(exc), "errors": _validation_errors(exc)}
    return JSONResponse(body, status_code=400)


async def _load_timeout(_request: Request, exc: GenerationLoadTimeoutError) -> JSONResponse:
    body = {"detail": str(exc), "generation": exc.generation}
    return JSONResponse(body, status_code=504, headers={"Retry-After": "1"})


async def _not_ready(_request: Request, exc: TableStateError) -> JSONResponse:
    return JSONResponse({"detail": str(exc)}, status_code=503, headers={"Retry-After": "1"})


async def _replica_failed(_request: Request, exc: StatesnapError) -> JSONResponse:
    # The background consumer failed while a request waited on it (broker lost, …).
    detail = f"replica failed: {type(exc).__name__}: {scrub(str(exc))}"
    return JSONResponse({"detail": detail}, status_code=503, headers={"Retry-After": "1"})


async def _bad_request(_request: Request, exc: ConfigError) -> JSONResponse:
    return JSONResponse({"detail": scrub(str(exc))}, status_code=400)


def answer_problems(app: FastAPI) -> None:
    """Install on *app* the answers to invalid requests and library errors (Starlette picks the
    handler of the most specific class, so ``ConfigError`` is a 400 though a ``StatesnapError``),
    and an OpenAPI document that shows 400, not 422."""
    app.exception_handler(RequestValidationError)(_invalid)
    app.exception_handler(GenerationLoadTimeoutError)(_load_timeout)
    app.exception_handler(TableStateError)(_not_ready)
    app.exception_handler(StatesnapError)(_replica_failed)
    app.exception_handler(ConfigError)(_bad_request)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            spec = get_openapi(
                title=app.title,
                version=app.version,
                description=app.description,
                routes=app.routes,
                tags=app.openapi_tags,
            )
            app.openapi_schema = _without_422(spec)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
