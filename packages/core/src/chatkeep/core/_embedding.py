"""Embedders: text to vectors for semantic recall. The :class:`Embedder` protocol and the in-process embedders.

:class:`LocalEmbedder` is what an embedder whose model runs in this process shares: the model is loaded on first
use, once per process, and runs in a worker thread so that an event loop is never blocked. :class:`WordLlamaEmbedder`
is one (``pip install "chatkeep-core[wordllama]"``); the default, :class:`~chatkeep.core.MiniLMEmbedder`, is another.
"""

from __future__ import annotations

import abc
import asyncio
import math
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar, Protocol, runtime_checkable

from chatkeep.core._errors import InvalidArgumentTypeError, MissingExtraError
from chatkeep.core._terms import keyword_terms

__all__ = ["Embedder", "LocalEmbedder", "WordLlamaEmbedder", "check_texts"]

_WORDLLAMA_EXTRA = (
    'WordLlamaEmbedder needs the wordllama package; install it with: pip install "chatkeep-core[wordllama]"'
)


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into vectors of one fixed width; a store records the ``name`` and width its index was built with.

    ``name`` must change whenever the vectors would (another model, another width): a store indexed under another
    name refuses the embedder with :class:`~chatkeep.core.EmbedderMismatchError` until ``chatkeep reindex``.
    """

    @property
    def name(self) -> str:
        """A stable name of the model and its settings, e.g. ``"all-MiniLM-L6-v2/onnx-int8"``."""
        ...

    @property
    def dimensions(self) -> int:
        """How many numbers each vector has."""
        ...

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One vector per text, in order."""
        ...


def check_texts(texts: object) -> list[str]:
    """``texts`` as a list of strings; a lone string (which iterates into characters) is refused by name."""
    if isinstance(texts, (str, bytes)) or not isinstance(texts, Sequence):
        raise InvalidArgumentTypeError(
            f"embed takes a list of strings, got {type(texts).__name__}; write embed(['first text', ...])"
        )
    listed = list(texts)
    for n, text in enumerate(listed):
        if not isinstance(text, str):
            raise InvalidArgumentTypeError(f"embed takes a list of strings, but item {n} is a {type(text).__name__}")
    return listed


class LocalEmbedder(abc.ABC):
    """An embedder whose model runs in this process: loaded on first use, once per process, shared, run off the loop.

    A subclass gives :attr:`name`, :attr:`dimensions`, how to load its model (:meth:`_load_model`) and how the loaded
    model embeds a batch of non-empty texts (:meth:`_embed_loaded`). An empty (or blank) text gets a vector of zeros.
    """

    _model: ClassVar[Any] = None
    _lock: ClassVar[threading.Lock] = threading.Lock()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._lock = threading.Lock()  # each model class loads once, without waiting for another's load

    @property
    @abc.abstractmethod
    def name(self) -> str:
        """A stable name of the model and its settings."""

    @property
    @abc.abstractmethod
    def dimensions(self) -> int:
        """How many numbers each vector has."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"

    @classmethod
    def load(cls) -> Any:
        """Load the model now (the first :meth:`embed` does it otherwise) and return it."""
        with cls._lock:
            if cls._model is None:
                cls._model = cls._load_model()
            return cls._model

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """Unit-length vectors of ``texts`` (an empty text gets a vector of zeros), computed in a worker thread."""
        listed = check_texts(texts)
        if not listed:
            return []
        return await asyncio.to_thread(self._embed_now, listed)

    def _embed_now(self, texts: list[str]) -> list[list[float]]:
        model = self.load()
        filled = [n for n, text in enumerate(texts) if text.strip()]
        vectors = [[0.0] * self.dimensions for _ in texts]
        if filled:
            for n, vector in zip(filled, self._embed_loaded(model, [texts[n] for n in filled]), strict=True):
                vectors[n] = vector
        return vectors

    @classmethod
    @abc.abstractmethod
    def _load_model(cls) -> Any:
        """Load the model; raise :class:`~chatkeep.core.MissingExtraError` naming the extra when it is absent."""

    @abc.abstractmethod
    def _embed_loaded(self, model: Any, texts: list[str]) -> list[list[float]]:
        """Unit-length vectors of ``texts`` (none of them blank), in order."""


class WordLlamaEmbedder(LocalEmbedder):
    """WordLlama ``l2_supercat`` at 256 dimensions, from the weights in its wheel: the fast, weaker offline embedder.

    It embeds the content words of a text (stop words left out, as the keyword index does).

    Its weights (16 MB) and its tokenizer ship inside the ``wordllama`` wheel on PyPI, so it runs with the network
    off from the first call; it embeds thousands of short messages a second, about 40 times as many as MiniLM in
    the same run, and loads in a second or two. It averages static token vectors, so it misses paraphrases that
    the default, :class:`~chatkeep.core.MiniLMEmbedder`, finds (docs/recall.md has both on the recall set).

    Raises:
        MissingExtraError: on first use, when ``chatkeep-core[wordllama]`` is not installed.
    """

    @property
    def name(self) -> str:
        """``"wordllama/l2_supercat-256/content-words"``."""
        return "wordllama/l2_supercat-256/content-words"

    @property
    def dimensions(self) -> int:
        """256."""
        return 256

    @classmethod
    def _load_model(cls) -> Any:
        return _load_wordllama()

    def _embed_loaded(self, model: Any, texts: list[str]) -> list[list[float]]:
        # Only the content words (keyword_terms): WordLlama averages its tokens' vectors, so the words every
        # sentence has ("what is the...") would pull all vectors together. On the recall set of the tests this
        # lifts vector-only recall@5 from 27 to 30 questions of 40.
        rows = model.embed([" ".join(keyword_terms(text)) or text for text in texts], norm=False)
        vectors = []
        for row in rows.tolist():
            norm = math.sqrt(sum(x * x for x in row))
            vectors.append([x / norm for x in row] if norm > 0 and math.isfinite(norm) else [0.0] * len(row))
        return vectors


def _load_wordllama() -> Any:
    try:
        import wordllama  # type: ignore[import-untyped]  # it has no py.typed
        from safetensors import safe_open
        from tokenizers import Tokenizer
        from wordllama.inference import WordLlamaInference  # type: ignore[import-untyped]
    except ModuleNotFoundError as exc:
        raise MissingExtraError(_WORDLLAMA_EXTRA) from exc
    # WordLlama.load() looks for the tokenizer in a folder its wheel does not have, then downloads it: the files
    # are read from the wheel here instead, so nothing is fetched.
    root = Path(wordllama.__file__).parent
    tokenizer = Tokenizer.from_file(str(root / "tokenizers" / "l2_supercat_tokenizer_config.json"))
    with safe_open(str(root / "weights" / "l2_supercat_256.safetensors"), framework="np", device="cpu") as weights:
        table = weights.get_tensor("embedding.weight")
    return WordLlamaInference(table, tokenizer, binary=False)
