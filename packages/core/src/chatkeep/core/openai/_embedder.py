"""Embeddings from any OpenAI-compatible server's ``/v1/embeddings``: OpenAI, Ollama, vLLM, llama.cpp, LM Studio."""

from __future__ import annotations

from collections.abc import Sequence

import openai
from openai import AsyncOpenAI

from chatkeep.core._embedding import check_texts
from chatkeep.core._errors import AgentConfigurationError, ModelError, redact_url
from chatkeep.core.openai._base import OwnedClient, answered, check_timeouts, connect, model_error

__all__ = ["OpenAIEmbedder"]

_NAME = "OpenAIEmbedder"
_API = "Embeddings"
#: Texts sent per request: OpenAI takes at most 2,048 inputs per call.
_BATCH = 512


class OpenAIEmbedder(OwnedClient):
    """An :class:`~chatkeep.core.Embedder` on the embeddings API of an OpenAI-compatible server.

    Args:
        model: the embedding model, e.g. ``"text-embedding-3-small"`` or Ollama's ``"nomic-embed-text"``.
        dimensions: the width of its vectors. Required: a store records it, and checks every vector against it.
        send_dimensions: ask the server for ``dimensions`` (models that can shorten their vectors, such as
            OpenAI's ``text-embedding-3-*``); otherwise the server's own width must be ``dimensions``.
        base_url, api_key, client, timeout, connect_timeout: as for :class:`~chatkeep.core.openai.OpenAIChatClient`
            (``OPENAI_BASE_URL`` and ``OPENAI_API_KEY`` by default; no key needed for a loopback server; the
            server may stay silent ``timeout`` seconds, 120 by default, retries included).

    Raises:
        AgentConfigurationError: no model, a ``dimensions`` below 1, no API key, or timeouts given with ``client``.
    """

    def __init__(
        self,
        model: str,
        *,
        dimensions: int,
        send_dimensions: bool = False,
        base_url: str | None = None,
        api_key: str | None = None,
        client: AsyncOpenAI | None = None,
        timeout: float | None = None,
        connect_timeout: float | None = None,
    ) -> None:
        if not isinstance(model, str) or not model:
            raise AgentConfigurationError(f"{_NAME} needs a model name, e.g. {_NAME}('text-embedding-3-small', ...)")
        if isinstance(dimensions, bool) or not isinstance(dimensions, int) or dimensions < 1:
            raise AgentConfigurationError(
                f"{_NAME}(dimensions={dimensions!r}): give the width of the model's vectors, a whole number above 0"
            )
        check_timeouts(_NAME, client, timeout, connect_timeout)
        connection = connect(_NAME, base_url, api_key, client, timeout, connect_timeout)
        self.model = model
        self._dimensions = dimensions
        self._send_dimensions = send_dimensions
        self._owns_client = client is None
        self._client = connection.client
        self._connection = connection
        #: Seconds the server may stay silent (``None``: the handed-in client's own timeouts apply).
        self.timeout = connection.timeout
        #: Seconds a connection may take to open (``None``: the handed-in client's own).
        self.connect_timeout = connection.connect_timeout
        self._closed = False

    @property
    def name(self) -> str:
        """``"openai:<model>"``: the model names the vectors (their width is recorded beside it)."""
        return f"openai:{self.model}"

    @property
    def dimensions(self) -> int:
        """The width of the vectors, as given."""
        return self._dimensions

    @property
    def _where(self) -> str:
        return redact_url(str(self._client.base_url))

    def __repr__(self) -> str:
        return f"{_NAME}(model={self.model!r}, dimensions={self._dimensions}, base_url={self._where!r})"

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One vector per text, asked ``_BATCH`` texts per request.

        Raises:
            ModelError: the server failed, did not answer in time, or sent vectors of another width.
        """
        listed = check_texts(texts)
        vectors: list[list[float]] = []
        for start in range(0, len(listed), _BATCH):
            vectors.extend(await self._embed(listed[start : start + _BATCH]))
        return vectors

    async def _embed(self, texts: list[str]) -> list[list[float]]:
        # An empty input is an error to OpenAI: send a space in its place.
        inputs = [text if text else " " for text in texts]
        try:
            if self._send_dimensions:
                call = self._client.embeddings.create(
                    model=self.model, input=inputs, encoding_format="float", dimensions=self._dimensions
                )
            else:
                call = self._client.embeddings.create(model=self.model, input=inputs, encoding_format="float")
            response = await answered(call, self.timeout, f"{_API} call failed: {self._where}", _NAME)
        except openai.OpenAIError as exc:
            raise model_error(
                exc,
                where=self._where,
                api_name=_API,
                model=self.model,
                not_found_hint=f"has no embedding model {self.model!r} (or no /embeddings endpoint); check the name",
                bad_request_hint=f"refused the request; check that {self.model!r} is an embedding model",
                timeouts=self._connection.described,
            ) from exc
        data = sorted(response.data, key=lambda item: item.index)
        if len(data) != len(texts):
            raise ModelError(f"{_API} call failed: {self._where} sent {len(data)} vectors for {len(texts)} texts")
        for item in data:
            if len(item.embedding) != self._dimensions:
                raise ModelError(
                    f"{_API} call failed: {self._where} sent vectors of {len(item.embedding)} dimensions for model "
                    f"{self.model!r}, not {self._dimensions}; give {_NAME}(dimensions={len(item.embedding)})"
                )
        return [list(item.embedding) for item in data]
