"""The fusion of the vector and keyword rankings, written once for every backend (``chatkeep.core.backend.fuse``)."""

from __future__ import annotations

from chatkeep.core import Message
from chatkeep.core.backend import Candidate, Rankings, fuse


def _candidates(texts: list[str]) -> list[Candidate]:
    return [Candidate("chat", seq, Message(role="user", text=text)) for seq, text in enumerate(texts)]


def test_a_message_that_only_shares_a_word_does_not_outrank_the_vectors_first_hit() -> None:
    # "What is my job?": the sentence model puts the fact first; the keyword ranking holds only the messages that
    # say "job", which the model also finds, a few places down. (With 1 / (60 + rank) they all outranked the fact.)
    fact, *others = _candidates(
        ["I work as a nurse on the night shift.", *[f"job interview tip {n}" for n in range(8)]]
    )
    fused = fuse(Rankings(vector=[fact, *others], keyword=others[2:7]), 5)
    assert fused[0].message is fact.message
    assert all(hit.score > 0 for hit in fused)


def test_a_keyword_only_first_hit_is_among_the_first_results() -> None:
    # An order number the model does not know: only the keyword ranking finds it, and it must still surface.
    order, *chatter = _candidates(["order A-77812 was sent back", *[f"small talk {n}" for n in range(20)]])
    fused = fuse(Rankings(vector=chatter, keyword=[order]), 5)
    assert order.message in [hit.message for hit in fused[:3]]


def test_a_message_both_rankings_put_first_is_first() -> None:
    first, *rest = _candidates(["the spare key is under the pot", "a", "b", "c"])
    fused = fuse(Rankings(vector=[first, *rest], keyword=[first]), 2)
    assert fused[0].message is first.message
    assert fused[0].score > fused[1].score
