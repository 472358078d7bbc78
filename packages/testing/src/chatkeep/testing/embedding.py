"""A deterministic embedder for tests: words hashed into a vector, no model, no network.

:class:`HashingEmbedder` gives texts that share words vectors that point the same way, so it finds a
near-identical message and nothing of meaning beyond the words. The conformance kit indexes with it, and the
local OpenAI-protocol server answers ``/v1/embeddings`` with :func:`hashed_vector`.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence

from chatkeep.core.backend import keyword_terms

__all__ = ["HashingEmbedder", "hashed_vector"]


def hashed_vector(text: str, dimensions: int, *, salt: str = "") -> list[float]:
    """The unit vector of ``text``'s words, each hashed (BLAKE2b, with ``salt``) to one of ``dimensions`` slots.

    A text without words gets a vector of zeros.
    """
    vector = [0.0] * dimensions
    for word in keyword_terms(text):
        digest = hashlib.blake2b(f"{salt}{word}".encode(), digest_size=8).digest()
        slot = int.from_bytes(digest[:4], "big") % dimensions
        vector[slot] += 1.0 if digest[4] & 1 else -1.0
    norm = math.sqrt(sum(x * x for x in vector))
    return vector if norm == 0 else [x / norm for x in vector]


class HashingEmbedder:
    """An :class:`~chatkeep.core.Embedder` of hashed words (:func:`hashed_vector`), named by its width and salt.

    Args:
        dimensions: the width of its vectors.
        salt: changes every vector (and the name), to stand for another model.
    """

    def __init__(self, dimensions: int = 64, *, salt: str = "") -> None:
        self._dimensions = dimensions
        self.salt = salt
        self.calls = 0
        self.texts_embedded = 0

    @property
    def name(self) -> str:
        """``"chatkeep-testing/hashing"`` with the salt, if any."""
        return "chatkeep-testing/hashing" + (f"+{self.salt}" if self.salt else "")

    @property
    def dimensions(self) -> int:
        """The width of its vectors."""
        return self._dimensions

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """The hashed vector of each text."""
        self.calls += 1
        self.texts_embedded += len(texts)
        return [hashed_vector(text, self._dimensions, salt=self.salt) for text in texts]
