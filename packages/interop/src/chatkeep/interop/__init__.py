"""chatkeep stores under the agent frameworks people already use.

One module per framework, each importing only its own framework (install its extra):

* :mod:`chatkeep.interop.openai_agents`: ``ChatkeepSession``, the OpenAI Agents SDK's ``Session``
  (``pip install "chatkeep-core[openai-agents]"``).
* :mod:`chatkeep.interop.agent_framework`: ``ChatkeepHistoryProvider``, a Microsoft Agent Framework
  ``HistoryProvider`` (``[agent-framework]``).
* :mod:`chatkeep.interop.langchain`: ``ChatkeepChatMessageHistory``, a LangChain
  ``BaseChatMessageHistory`` (``[langchain]``).
* :mod:`chatkeep.interop.langgraph`: ``ChatkeepSaver``, a LangGraph checkpointer (``BaseCheckpointSaver``), and
  ``ChatkeepStore``, its long-term memory store (``BaseStore``) (``[langgraph]``).
* :mod:`chatkeep.interop.llama_index`: ``ChatkeepChatStore``, a LlamaIndex chat store (``[llama-index]``).
* :mod:`chatkeep.interop.pydantic_ai`: ``ChatkeepConversationStore``, a Pydantic AI ``ConversationStore``
  (``[pydantic-ai]``).
* :mod:`chatkeep.interop.adk`: ``ChatkeepSessionService`` and ``ChatkeepMemoryService``, Google ADK's session
  and memory services (``[adk]``).

Every adapter takes a store, a store URL or a backend name, plus the tenant and session id, and keeps the
framework's own items exactly: what the framework writes is what it reads back, field for field.
"""
