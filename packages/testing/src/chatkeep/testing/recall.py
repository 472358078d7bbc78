"""Recall quality on a labelled set: how often a search finds the planted fact a question asks about.

The set (``data/recall_set.json`` beside this module) is a conversation of 640 messages with 40 planted facts, and
40 questions that paraphrase them, most of which share no content word with their fact. Ten facts hinge on a rare
identifier (an order number, a code, a surname) among eight near-identical messages of other identifiers each,
where words decide and a sentence embedding barely tells them apart. :func:`measure_recall`
indexes it in a store with an embedder and asks each question three ways: by keywords only, by vector only, and
hybrid (the two fused); recall@k is the share of questions whose fact is among the ``k`` best results. The memory
store's numbers are in docs/recall.md; any searchable store can be measured the same way.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from chatkeep.core import Embedder, Message, SessionKey, embed_messages
from chatkeep.core.backend import SearchableStore, keyword_terms

__all__ = ["MODES", "RecallResult", "RecallSet", "load_recall_set", "measure_recall"]

#: The three ways a question is asked.
MODES = ("keyword only", "vector only", "hybrid")
_DATA = Path(__file__).parent / "data" / "recall_set.json"


@dataclass(frozen=True)
class RecallSet:
    """The labelled conversation: its messages, the index of each fact's message, and the questions in fact order."""

    messages: list[Message]
    fact_messages: list[int]
    questions: list[str]

    def without_shared_words(self) -> int:
        """How many questions share no content word with their fact (words compared by their first five letters)."""

        def stems(text: str) -> set[str]:
            return {term[:5] for term in keyword_terms(text)}

        return sum(
            not (stems(self.messages[at].text) & stems(question))
            for at, question in zip(self.fact_messages, self.questions, strict=True)
        )


@dataclass(frozen=True)
class RecallResult:
    """How many of the set's questions each mode answered with its fact among the first ``k`` results."""

    k: int
    questions: int
    found: dict[str, int]

    def recall(self, mode: str) -> float:
        """recall@k of ``mode`` (one of :data:`MODES`)."""
        return self.found[mode] / self.questions

    def table(self, title: str) -> str:
        """The Markdown table docs/recall.md keeps, under ``title``."""
        rows = [f"| {mode} | {self.recall(mode):.3f} ({self.found[mode]}/{self.questions}) |" for mode in MODES]
        return "\n".join([title, f"| search | recall@{self.k} |", "| --- | --- |", *rows])


def load_recall_set() -> RecallSet:
    """The labelled set, with fresh messages (new ids) on every call."""
    data = json.loads(_DATA.read_text(encoding="utf-8"))
    rows = data["messages"]
    facts = {row["fact"]: n for n, row in enumerate(rows) if "fact" in row}
    return RecallSet(
        messages=[Message(role=row["role"], text=row["text"]) for row in rows],
        fact_messages=[facts[n] for n in range(len(data["questions"]))],
        questions=list(data["questions"]),
    )


async def measure_recall(
    store: SearchableStore, key: SessionKey, embedder: Embedder, recall_set: RecallSet, k: int = 5
) -> RecallResult:
    """Index ``recall_set`` in ``key``'s session of ``store`` with ``embedder`` and ask every question three ways.

    The session is deleted afterwards (a store's index stays bound to ``embedder``).
    """
    messages = recall_set.messages
    found = dict.fromkeys(MODES, 0)
    try:
        await store.append(key, messages, embeddings=await embed_messages(embedder, messages))
        vectors = await embedder.embed(recall_set.questions)
        for at, question, vector in zip(recall_set.fact_messages, recall_set.questions, vectors, strict=True):
            for mode, (query_vector, query_text) in zip(
                MODES, [(None, question), (vector, None), (vector, question)], strict=True
            ):
                hits = await store.search(key, query_vector, query_text, k, embedder=embedder.name)
                found[mode] += messages[at].message_id in [hit.message.message_id for hit in hits]
    finally:
        await store.delete(key)
    return RecallResult(k, len(recall_set.questions), found)
