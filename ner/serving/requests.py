"""What one request may ask, and reading it under those limits: the body (refused while streaming once it is over
the byte limit), the texts, their count and length. Every route that reads a body reads it here."""

from dataclasses import dataclass

from ner.serving.batcher import BatchLimits

MIB = 1024 * 1024


@dataclass
class Limits(BatchLimits):
    """What one request may ask (the batching and queue limits are BatchLimits')."""

    max_request_bytes: int = MIB
    max_texts: int = 256
    max_text_chars: int = 100_000  # one such text stays under --request-timeout (docs/serving.md, "Long texts")


class BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


async def read_body(request, limit: int) -> bytes:
    """The body, refused (413) as soon as it is known to be over `limit` bytes, without reading it all."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BadRequest(413, f"request body is {declared} bytes; the limit is {limit} (--max-request-bytes)")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise BadRequest(413, f"request body is over {limit} bytes (--max-request-bytes)")
    return bytes(body)


def parse_texts(body: bytes, max_texts: int, max_text_chars: int | None = None) -> tuple[list[str], bool]:
    """(texts, whether the request sent one "text") from {"text": str} or {"texts": [str, ...]}."""
    import json

    try:
        payload = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadRequest(422, f"body is not JSON ({exc}); send {{\"text\": \"...\"}} or {{\"texts\": [...]}}") from None
    if not isinstance(payload, dict) or len(payload) != 1 or not ({"text", "texts"} & payload.keys()):
        raise BadRequest(422, 'expected an object with exactly one key: "text" (a string) or "texts" (strings)')
    single = "text" in payload
    texts = [payload["text"]] if single else payload["texts"]
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise BadRequest(422, '"text" must be a string and "texts" a list of strings')
    check_texts(texts, max_texts, max_text_chars)
    return texts, single


def check_texts(texts: list[str], max_texts: int, max_text_chars: int | None = None) -> None:
    """413 for more than `max_texts` texts or a text over `max_text_chars`; 422 for a lone surrogate."""
    if len(texts) > max_texts:
        raise BadRequest(413, f"{len(texts)} texts in one request; the limit is {max_texts} (--max-texts)")
    for i, text in enumerate(texts):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise BadRequest(422, f"text {i} holds a lone surrogate (\\ud800-\\udfff): not valid Unicode") from None
        if max_text_chars is not None and len(text) > max_text_chars:
            raise BadRequest(413, f"text {i} has {len(text)} characters; the limit is {max_text_chars} "
                                  "(--max-text-chars): send it in parts")
