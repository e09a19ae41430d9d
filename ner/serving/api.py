"""The typed surface of `ner.serve`: the pydantic models /openapi.json is built from, and the optional API key.

    curl -s localhost:8000/openapi.json | python -m json.tool
    NER_API_KEY=s3cret python -m ner.serve runs/ner/final
    curl -s localhost:8000/predict -H 'Authorization: Bearer s3cret' -d '{"text": "Ada Lovelace"}'

The models describe; they do not parse. A pydantic body parameter would have FastAPI read the whole body
before the --max-request-bytes cap (requests.read_body refuses while streaming) and answer with its own 422
messages, and a response_model would re-serialise every answer; so requests.parse_texts reads the body by hand
and these models only feed the document. Every model forbids extra keys: the document says exactly what is
sent and answered, and tests/test_serve_api.py (schemathesis) checks the answers against it.
"""

from __future__ import annotations

import base64
import hmac

from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request

EXACT = ConfigDict(extra="forbid")


class OneText(BaseModel):
    model_config = ConfigDict(extra="forbid", title="OneText")
    text: str = Field(description="raw text; answered with {\"entities\": [...]}")


class ManyTexts(BaseModel):
    model_config = ConfigDict(extra="forbid", title="ManyTexts")
    texts: list[str] = Field(description="raw texts (at most --max-texts); answered with {\"results\": [...]}")


class Entity(BaseModel):
    model_config = EXACT
    text: str = Field(description="the entity as it appears: the request's text[start:end]")
    type: str = Field(description="entity type, e.g. PER (GET /health lists them)")
    start: int = Field(description="first character, counted in code points")
    end: int = Field(description="one past the last character")
    score: float = Field(description="mean probability of the entity's word tags")


class Entities(BaseModel):
    model_config = EXACT
    entities: list[Entity]
    confidence: float = Field(description="how sure the model is of the text's whole tag sequence, entities or "
                                          "none: the geometric mean of its words' tag probabilities; low = unsure")


class Results(BaseModel):
    model_config = EXACT
    results: list[Entities] = Field(description="one per text, in order")


class Error(BaseModel):
    model_config = EXACT
    error: str = Field(description="one line saying what is wrong or what to do")


class Health(BaseModel):
    model_config = EXACT
    status: str = Field(description='"ok" (200), or "failed" (503) once the batcher has died')
    model: str = Field(description="the model folder served")
    base_model: str | None = Field(description="the encoder it was fine-tuned from, where recorded")
    labels: list[str] = Field(description="the tag set, in id order")
    types: list[str] = Field(description="entity types")
    in_flight: int = Field(description="/predict requests received and not yet answered")
    queued_texts: int = Field(description="texts admitted and not yet started (what --max-queue bounds)")
    ready: bool = Field(description="what GET /ready would answer: warmed up, not draining, not failed")
    draining: bool = Field(description="SIGTERM received: finishing what fits --shutdown-timeout")
    pid: int = Field(description="the process that answered (with --workers N, one of N)")
    error: str | None = Field(default=None, description="why the process is failing (with status \"failed\")")


class Ready(BaseModel):
    model_config = EXACT
    status: str = Field(description='"ready" (200); otherwise why not: "starting", "draining" or "failed" (503)')
    error: str | None = Field(default=None, description="what to do meanwhile (503)")


def describe(why: str, *models: type[BaseModel], headers: dict | None = None) -> dict:
    """One entry of a route's `responses`: a model (or any of several) and why it is sent."""
    entry: dict = {"description": why, "model": models[0] if len(models) == 1 else models[0] | models[1]}
    if headers:
        entry["headers"] = headers
    return entry


RETRY_AFTER = {"Retry-After": {"description": "seconds to wait before retrying", "schema": {"type": "integer"}}}
BEARER = {"WWW-Authenticate": {"description": "Bearer", "schema": {"type": "string"}}}


def predict_openapi(max_texts: int, api_key: bool, max_text_chars: int | None = None) -> dict:
    """The decorator arguments that document POST /predict: the body shapes parse_texts accepts (with this
    server's --max-texts), the answers, each error status; 401 only where an API key is required."""
    many = ManyTexts.model_json_schema()
    many["properties"]["texts"]["maxItems"] = max_texts
    one = OneText.model_json_schema()
    if max_text_chars is not None:
        one["properties"]["text"]["maxLength"] = max_text_chars
        many["properties"]["texts"]["items"]["maxLength"] = max_text_chars
    body = {"oneOf": [one, many]}
    errors = {
        413: describe("body over --max-request-bytes, more than --max-texts texts, or a text over --max-text-chars",
                      Error),
        422: describe('not JSON, or not exactly one of "text" (a string) and "texts" (strings)', Error),
        500: describe("the model failed on this request's text (the server log says why); the server goes on",
                      Error),
        503: describe("the queue is full (--max-queue) or the server is stopping; retry after Retry-After seconds",
                      Error, headers=RETRY_AFTER),
        504: describe("not answered within --request-timeout", Error),
    }
    if api_key:
        errors[401] = describe("no Authorization: Bearer header, or the wrong key (--api-key, NER_API_KEY)",
                               Error, headers=BEARER)
    return {"openapi_extra": {"requestBody": {"required": True, "content": {"application/json": {"schema": body}}}},
            "responses": {200: describe("entities with character offsets", Entities, Results), **errors}}


def health_openapi() -> dict:
    return {"responses": {200: describe("the process is alive: the model and its labels", Health),
                          503: describe("the batcher has stopped: the process is about to exit", Health)}}


def ready_openapi() -> dict:
    """For GET /ready (the route lives with the readiness code)."""
    return {"responses": {200: describe("the model is loaded and warm: send requests", Ready),
                          503: describe("starting, or draining after SIGTERM: send requests elsewhere",
                                        Ready, Error)}}


def metrics_openapi() -> dict:
    return {"responses": {200: {"description": "Prometheus text format",
                                "content": {"text/plain": {"schema": {"type": "string"}}}}}}


def label_studio_openapi(api_key: bool) -> dict[str, dict]:
    """Route name -> the decorator arguments that document /label-studio/*: Label Studio's bodies are JSON
    objects checked by meaning (the label config's XML, the tasks' fields), so their schemas are open objects;
    the statuses are exact."""
    anything = {"content": {"application/json": {"schema": {"type": "object"}}}}
    error = {"content": {"application/json": {"schema": Error.model_json_schema()}}}
    body = {"requestBody": {"required": True, **anything}}
    refused = {413: {"description": "body over --max-request-bytes, more tasks than --max-texts, or a text over "
                                    "--max-text-chars", **error},
               422: {"description": "not a JSON object, or a label config or task this backend cannot serve",
                     **error}}
    if api_key:
        refused[401] = {"description": "no key: Authorization: Bearer KEY, or basic auth with KEY as the password",
                        **error, "headers": {"WWW-Authenticate": {"schema": {"type": "string"}}}}
    busy = {500: {"description": "the model failed on a task's text", **error},
            503: {"description": "the queue is full or the server is stopping", **error, "headers": RETRY_AFTER},
            504: {"description": "not answered within --request-timeout", **error}}
    answers = {"health": "the backend is up: its model_version and the last training's status",
               "setup": "the model_version", "predict": "one result per task, in order",
               "webhook": "the event was received; whether it started a training",
               "train": "whether a training started"}
    documented = {}
    for route, why in answers.items():
        responses = {200: {"description": why, **anything}}
        if route != "health":
            responses.update(refused)
            documented[route] = {"openapi_extra": body}
        if route == "predict":
            responses.update(busy)
        documented[route] = {**documented.get(route, {}), "responses": responses}
    return documented


def presented_key(authorization: str | None, basic_auth: bool) -> bytes:
    """The key an Authorization header carries: `Bearer KEY`, or where `basic_auth` allows it the password of
    HTTP basic authentication; b"" for anything else."""
    scheme, _, value = (authorization or "").partition(" ")
    if scheme.lower() == "bearer":
        return value.strip().encode("utf-8")
    if basic_auth and scheme.lower() == "basic":
        try:
            return base64.b64decode(value.strip(), validate=True).partition(b":")[2]
        except ValueError:
            return b""
    return b""


def key_check(api_key: str, documented, basic_auth: bool):
    """A FastAPI dependency: 401 {"error"} with WWW-Authenticate unless the request's Authorization header carries
    `api_key` (presented_key). Compared in constant time, so the answer's timing does not reveal how much of a
    guess was right. `documented`: the FastAPI security scheme that puts the key into /openapi.json."""
    from fastapi import Depends
    from starlette.exceptions import HTTPException

    expected = api_key.encode("utf-8")
    how = "Authorization: Bearer KEY, or basic auth with KEY as the password" if basic_auth else \
        "Authorization: Bearer KEY"

    async def check(request: Request, _: object = Depends(documented)) -> None:
        if not hmac.compare_digest(presented_key(request.headers.get("authorization"), basic_auth), expected):
            raise HTTPException(401, f"missing or wrong API key: send {how}",
                                headers={"WWW-Authenticate": "Bearer, Basic" if basic_auth else "Bearer"})

    return check


def bearer_key_check(api_key: str):
    """ner.serve's routes: the API key as a Bearer token (HTTPBearer documents the scheme)."""
    from fastapi.security import HTTPBearer

    return key_check(api_key, HTTPBearer(auto_error=False, description="--api-key or NER_API_KEY"), basic_auth=False)


def label_studio_key_check(api_key: str):
    """The Label Studio routes: the API key as a Bearer token, or as the password of HTTP basic authentication
    (what Label Studio's model connection sends: *Use basic auth*)."""
    from fastapi.security import APIKeyHeader

    header = APIKeyHeader(name="Authorization", auto_error=False, description="Bearer KEY, or basic auth with KEY "
                                                                              "as the password (--api-key)")
    return key_check(api_key, header, basic_auth=True)
