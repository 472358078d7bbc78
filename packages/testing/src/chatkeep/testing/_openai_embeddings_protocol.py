"""The embeddings protocol of :class:`~chatkeep.testing.openai_server.FakeOpenAIServer`.

``POST /v1/embeddings``: one deterministic vector per input (:func:`~chatkeep.testing.embedding.hashed_vector`,
salted with the model's name, so that two models give different vectors), as floats or, with
``encoding_format: "base64"``, as little-endian float32 in base64, as the real service does.
Requests the real service would refuse get HTTP 400.
"""

from __future__ import annotations

import base64
import struct
from typing import Any

from ._openai_fake_types import FakeHTTPResponse, FakeRequest, count_words, error_body
from .embedding import hashed_vector

__all__ = ["DEFAULT_EMBEDDING_DIMENSIONS", "EmbeddingsRoutes"]

#: The width of the vectors when a request does not ask for one (``dimensions``).
DEFAULT_EMBEDDING_DIMENSIONS = 64


def _problem(body: Any) -> str | None:
    if not isinstance(body, dict):
        return "the request body must be a JSON object"
    if not isinstance(body.get("model"), str) or not body["model"]:
        return "you must provide a model parameter"
    inputs = body.get("input")
    if isinstance(inputs, str):
        inputs = [inputs]
    if not isinstance(inputs, list) or not inputs or not all(isinstance(i, str) and i for i in inputs):
        return "'input' must be a non-empty string or a non-empty list of non-empty strings"
    dimensions = body.get("dimensions", DEFAULT_EMBEDDING_DIMENSIONS)
    if isinstance(dimensions, bool) or not isinstance(dimensions, int) or dimensions < 1:
        return "'dimensions' must be an integer of 1 or more"
    if body.get("encoding_format", "float") not in ("float", "base64"):
        return "'encoding_format' must be 'float' or 'base64'"
    return None


class EmbeddingsRoutes:
    """A mixin for the fake server: the ``POST /v1/embeddings`` route handler (:meth:`_embeddings`)."""

    def _embeddings(self, request: FakeRequest) -> FakeHTTPResponse:
        body = request.body
        problem = _problem(body)
        if problem is not None:
            return FakeHTTPResponse(400, error_body(problem, "invalid_request_error"))
        assert isinstance(body, dict)
        inputs = [body["input"]] if isinstance(body["input"], str) else body["input"]
        dimensions = body.get("dimensions", DEFAULT_EMBEDDING_DIMENSIONS)
        data = []
        for index, text in enumerate(inputs):
            vector = hashed_vector(text, dimensions, salt=body["model"])
            embedding: Any = vector
            if body.get("encoding_format") == "base64":
                embedding = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
            data.append({"object": "embedding", "index": index, "embedding": embedding})
        tokens = sum(count_words(text) for text in inputs)
        return FakeHTTPResponse(
            json_body={
                "object": "list",
                "data": data,
                "model": body["model"],
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            }
        )
