"""Model clients for OpenAI and OpenAI-compatible servers (install with ``pip install "chatkeep-core[openai]"``)."""

from chatkeep.core._errors import MissingExtraError

try:
    import openai as _openai  # noqa: F401 - only checks that the extra is installed
except ModuleNotFoundError as exc:
    if exc.name != "openai":
        raise  # the openai package is there but broken: show its own error
    raise MissingExtraError(
        'chatkeep.core.openai needs the openai package; install it with: pip install "chatkeep-core[openai]"'
    ) from exc

from chatkeep.core.openai._chat_client import OpenAIChatClient
from chatkeep.core.openai._embedder import OpenAIEmbedder
from chatkeep.core.openai._responses_client import OpenAIResponsesClient

__all__ = ["OpenAIChatClient", "OpenAIEmbedder", "OpenAIResponsesClient"]
