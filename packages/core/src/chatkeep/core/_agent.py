"""The agent: runs providers around model calls and a bounded tool loop."""

from __future__ import annotations

import copy
import dataclasses
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from typing_extensions import Self

from chatkeep.core import _telemetry
from chatkeep.core._chat import ChatClient, ChatOptions, ChatResponse
from chatkeep.core._errors import (
    AgentConfigurationError,
    HistoryModeConflictError,
    InvalidArgumentTypeError,
    ModelError,
    ToolError,
)
from chatkeep.core._loop_thread import LoopThread
from chatkeep.core._messages import FunctionCallContent, FunctionResultContent, Message, Usage
from chatkeep.core._providers import (
    ContextProvider,
    HistoryProvider,
    InMemoryHistoryProvider,
    SessionContext,
    StoreHistoryProvider,
    history_provider,
)
from chatkeep.core._session import DEFAULT_TENANT, AgentSession
from chatkeep.core._tools import FunctionTool, as_tools
from chatkeep.core.backend import HistoryStore, SessionKey

__all__ = ["Agent", "AgentInput", "AgentResponse", "AgentResponseUpdate", "BaseChatClient"]

log = logging.getLogger("chatkeep.agent")

AgentInput = str | Message | Sequence[str | Message] | None


@dataclass
class AgentResponse:
    """The result of one run.

    Attributes:
        messages: the messages the run produced: assistant messages and tool results, in order.
        usage: token counts summed over the run's model calls (``None`` when the service reports none).
        response_id: the service's id of the last model response.
        conversation_id: the service's conversation id after the run (service-managed history).
    """

    messages: list[Message] = field(default_factory=list)
    usage: Usage | None = None
    response_id: str | None = None
    conversation_id: str | None = None

    @property
    def text(self) -> str:
        """The text of the run's assistant messages (for most runs, the final answer)."""
        return "".join(m.text for m in self.messages if m.role == "assistant")

    def __str__(self) -> str:
        return self.text


@dataclass
class AgentResponseUpdate:
    """One piece of a streamed run.

    Attributes:
        text: text that just arrived (may be empty).
        message: a message the run completed (an assistant message or tool results), when one just completed.
        response: on the last update only: the whole :class:`AgentResponse`.
    """

    text: str = ""
    message: Message | None = None
    response: AgentResponse | None = None

    def __str__(self) -> str:
        return self.text


def _to_messages(value: AgentInput) -> list[Message]:
    if value is None:
        return []
    if isinstance(value, str):
        return [Message(role="user", text=value)]
    if isinstance(value, Message):
        return [value]
    result: list[Message] = []
    for item in value:
        if isinstance(item, str):
            result.append(Message(role="user", text=item))
        elif isinstance(item, Message):
            result.append(item)
        else:
            raise InvalidArgumentTypeError(
                f"run() takes text, a Message or a list of them; got a {type(item).__name__} in the list"
            )
    return result


class Agent:
    """An agent: a chat client, instructions, tools and the providers that give it context and memory.

    Example:
        ``agent = Agent(client, name="Helper", instructions="Be brief.", history="memory://")``

    Args:
        client: the model client (anything implementing :class:`~chatkeep.core.ChatClient`).
        name: the agent's name (set as ``author_name`` on the messages it writes).
        instructions: system instructions sent with every model call (never stored as history).
        tools: Python functions or :class:`FunctionTool` objects the model may call.
        context_providers: providers run around each run, in order.
        history: where history lives: a backend URL (``"redis://..."``), a :class:`HistoryStore`, or a
            :class:`HistoryProvider`. Without it, history is kept in the session (``InMemoryHistoryProvider``).
        max_tool_iterations: the most model calls that may ask for tools in one run.
        require_per_service_call_history_persistence: store history after each model call of a tool loop.
        description: what the agent is for.

    Raises:
        AgentConfigurationError: more than one provider loads history, or two providers share a ``source_id``.
    """

    def __init__(
        self,
        client: ChatClient,
        *,
        name: str | None = None,
        instructions: str | None = None,
        tools: Sequence[Any] | None = None,
        context_providers: Sequence[ContextProvider] | None = None,
        history: str | HistoryStore | HistoryProvider | None = None,
        max_tool_iterations: int = 10,
        require_per_service_call_history_persistence: bool = False,
        description: str | None = None,
    ) -> None:
        self.client = client
        self.name = name
        self.instructions = instructions
        self.description = description
        self.tools: list[FunctionTool] = as_tools(list(tools) if tools else None)
        self.max_tool_iterations = max_tool_iterations
        self.require_per_service_call_history_persistence = require_per_service_call_history_persistence
        self.context_providers: list[ContextProvider] = list(context_providers or [])
        self._owned: list[ContextProvider] = []
        # run_sync's private event loop; its thread starts on first use.
        self._loop_thread = LoopThread(f"chatkeep-agent-{name}" if name else "chatkeep-agent")
        if history is not None:
            provider = self._history_provider(history)
            self.context_providers.append(provider)
        self._check_providers()

    def _history_provider(self, history: str | HistoryStore | HistoryProvider) -> HistoryProvider:
        if isinstance(history, HistoryProvider):
            return history
        if isinstance(history, HistoryStore):
            return StoreHistoryProvider(history)
        if isinstance(history, str):
            provider = history_provider(history)
            self._owned.append(provider)
            return provider
        raise InvalidArgumentTypeError(
            f"history= takes a backend URL, a HistoryStore or a HistoryProvider, not {type(history).__name__}"
        )

    def _check_providers(self) -> None:
        seen: set[str] = set()
        for provider in self.context_providers:
            if provider.source_id in seen:
                raise AgentConfigurationError(
                    f"two context providers share source_id {provider.source_id!r}; give each a unique source_id"
                )
            seen.add(provider.source_id)
        loaders = [p for p in self.context_providers if isinstance(p, HistoryProvider) and p.load_messages]
        if len(loaders) > 1:
            names = ", ".join(repr(p) for p in loaders)
            raise AgentConfigurationError(
                f"only one history provider may load messages, but {names} all do; set load_messages=False on all "
                "but one (the others then only record, like an audit log)"
            )

    def __repr__(self) -> str:
        return f"Agent(name={self.name!r}, client={type(self.client).__name__}, providers={self.context_providers!r})"

    # -- sessions --------------------------------------------------------------------------------

    def create_session(self, *, session_id: str | None = None, tenant: str = DEFAULT_TENANT) -> AgentSession:
        """A new, empty session; ``tenant`` must come from your server's authentication."""
        return AgentSession(session_id=session_id, tenant=tenant)

    def get_session(
        self, *, service_session_id: str, session_id: str | None = None, tenant: str = DEFAULT_TENANT
    ) -> AgentSession:
        """A session continuing a conversation the model service already holds (service-managed history)."""
        return AgentSession(session_id=session_id, tenant=tenant, service_session_id=service_session_id)

    async def fork_session(
        self, session: AgentSession, *, through: str | None = None, session_id: str | None = None
    ) -> AgentSession:
        """A new session continuing ``session``'s conversation from message ``through`` (default: its newest).

        The history is forked in the agent's store (:meth:`HistoryStore.fork`: nothing is copied), so the two
        sessions go on independently; the old one stays as it was. Rewinding is forking from an earlier message:
        ``await agent.fork_session(session, through=earlier.message_id)``. The new session has its own id, the
        same tenant and a copy of ``session.state``; when the store holds ``session``'s document, the new one is
        saved too, bound to the same owner.

        Args:
            session: the session to fork (it must have stored messages).
            through: the id of the last message the new session takes (``None``: all of them).
            session_id: the new session's id (default: a new random id).

        Raises:
            AgentConfigurationError: the agent keeps no history in a store (``history=`` a URL or a store), or
                ``session`` is service-managed (its history is the model service's).
            InvalidArgumentError: ``through`` is not a message of ``session``.
            ConcurrencyConflictError: a session with ``session_id`` already exists.
        """
        provider = self.history_provider
        if not isinstance(provider, StoreHistoryProvider):
            raise AgentConfigurationError(
                "fork_session forks the history in the agent's store, and this agent keeps none; pass "
                'history="sqlite:///chat.db" (or another store URL, a HistoryStore) when building the agent'
            )
        if session.service_session_id is not None:
            raise AgentConfigurationError(
                f"session {session.session_id!r} is service-managed (its history is the model service's); fork "
                "sessions whose history the agent stores"
            )
        forked = AgentSession(session_id=session_id, tenant=session.tenant, state=copy.deepcopy(session.state))
        store = provider.store
        source = SessionKey.of(session)
        await store.fork(source, SessionKey.of(forked), through=through)
        stored = await store.load_session(source)
        if stored is not None:
            await store.save_session(SessionKey.of(forked), forked, owner=stored.owner)
        return forked

    @property
    def history_provider(self) -> HistoryProvider | None:
        """The provider that loads history, if one is configured."""
        for provider in self.context_providers:
            if isinstance(provider, HistoryProvider) and provider.load_messages:
                return provider
        return None

    # -- running ---------------------------------------------------------------------------------

    async def run(
        self, input: AgentInput = None, *, session: AgentSession | None = None, options: ChatOptions | None = None
    ) -> AgentResponse:
        """Run the agent on new input and return its response.

        Args:
            input: text, a :class:`Message`, or a list of them.
            session: the conversation to continue (a new one when omitted: the run then has no history).
            options: per-run model options (``conversation_id``, ``temperature``...).

        Raises:
            HistoryModeConflictError: the run mixes service-managed and local history.
            ModelError: the model service failed.
            ToolError: the tool loop did not finish within ``max_tool_iterations``.
        """
        response: AgentResponse | None = None
        async for update in self._run(input, session=session, options=options, stream=False):
            if update.response is not None:
                response = update.response
        assert response is not None  # _run always ends with the response or raises
        return response

    async def run_stream(
        self, input: AgentInput = None, *, session: AgentSession | None = None, options: ChatOptions | None = None
    ) -> AsyncIterator[AgentResponseUpdate]:
        """Run the agent and yield text as it arrives; the last update carries the whole response."""
        async for update in self._run(input, session=session, options=options, stream=True):
            yield update

    def _service_mode(self, session: AgentSession, options: ChatOptions) -> bool:
        explicit = options.conversation_id is not None
        if explicit and any(isinstance(p, HistoryProvider) and p.load_messages for p in self.context_providers):
            raise HistoryModeConflictError(
                "this run names a service conversation (options.conversation_id) and the agent has a history provider "
                "that loads messages, so the model would see the history twice; drop the conversation_id to keep "
                "history locally, or remove the loading provider (or set load_messages=False) to let the service "
                "keep it"
            )
        service = (
            explicit or session.service_session_id is not None or bool(getattr(self.client, "keeps_history", False))
        )
        if service and self.require_per_service_call_history_persistence:
            raise HistoryModeConflictError(
                "require_per_service_call_history_persistence=True needs locally kept history, but this session's "
                "history is kept by the model service (session.service_session_id is set, or the client stores "
                "conversations); turn the flag off, or use a client that does not store history (store=False)"
            )
        return service

    def _providers_for(self, service_mode: bool) -> list[ContextProvider]:
        if service_mode:
            # The service holds the conversation: loading providers neither load nor store; recorders still record.
            return [p for p in self.context_providers if not (isinstance(p, HistoryProvider) and p.load_messages)]
        if self.history_provider is None:
            return [*self.context_providers, InMemoryHistoryProvider()]
        return list(self.context_providers)

    def _run(
        self, input: AgentInput, *, session: AgentSession | None, options: ChatOptions | None, stream: bool
    ) -> AsyncIterator[AgentResponseUpdate]:
        """The run's updates, traced as one GenAI ``invoke_agent`` span (no-op unless OpenTelemetry is set up)."""
        session = session if session is not None else self.create_session()
        options = options or ChatOptions()
        attributes: _telemetry.Attributes = {"gen_ai.operation.name": "invoke_agent"}
        for name, value in (
            ("gen_ai.agent.name", self.name),
            ("gen_ai.provider.name", getattr(self.client, "provider_name", None)),
            ("gen_ai.request.model", options.model or getattr(self.client, "model", None)),
        ):
            if isinstance(value, str):
                attributes[name] = value
        return _telemetry.agent_run(
            self._run_steps(input, session=session, options=options, stream=stream),
            agent_name=self.name,
            attributes=attributes,
            ids={"gen_ai.conversation.id": session.session_id, "chatkeep.tenant.id": session.tenant},
            outcome=_run_outcome,
        )

    async def _run_steps(
        self, input: AgentInput, *, session: AgentSession, options: ChatOptions, stream: bool
    ) -> AsyncIterator[AgentResponseUpdate]:
        service_mode = self._service_mode(session, options)
        providers = self._providers_for(service_mode)
        context = SessionContext(_to_messages(input))
        for provider in providers:
            await _call_hook(provider.before_run, provider, self, session, context)
        instructions = "\n\n".join(t for t in (self.instructions, *context.instructions.values()) if t) or None
        chat_options = dataclasses.replace(
            options,
            instructions=instructions,
            # as_tools refuses two tools of one name: a provider's tool must not shadow the agent's.
            tools=as_tools([*self.tools, *options.tools, *(t for batch in context.tools.values() for t in batch)]),
            conversation_id=options.conversation_id or session.service_session_id,
        )
        per_call = self.require_per_service_call_history_persistence
        step_store = _PerCallStore(self, session, context, providers) if per_call else None
        try:
            response: AgentResponse | None = None
            async for update in self._tool_loop(context.get_messages(), chat_options, service_mode, stream, step_store):
                if update.response is not None:
                    response = update.response
                else:
                    yield update
            assert response is not None
        except BaseException as exc:
            context.error = exc
            await self._after_run(providers, session, context, failed=True, skip_history=per_call)
            raise
        context.response = response
        if response.conversation_id is not None:
            session.service_session_id = response.conversation_id
        await self._after_run(providers, session, context, failed=False, skip_history=per_call)
        yield AgentResponseUpdate(response=response)

    async def _after_run(
        self,
        providers: list[ContextProvider],
        session: AgentSession,
        context: SessionContext,
        *,
        failed: bool,
        skip_history: bool,
    ) -> None:
        for provider in providers:
            if skip_history and isinstance(provider, HistoryProvider):
                continue  # per-call persistence already stored each completed step
            if failed:
                try:
                    await _call_hook(provider.after_run, provider, self, session, context)
                except Exception:  # the run's own error is the one to raise
                    log.exception("%r failed in after_run while handling a failed run", provider)
            else:
                await _call_hook(provider.after_run, provider, self, session, context)

    async def _tool_loop(
        self,
        messages: list[Message],
        options: ChatOptions,
        service_mode: bool,
        stream: bool,
        step_store: _PerCallStore | None,
    ) -> AsyncIterator[AgentResponseUpdate]:
        produced: list[Message] = []
        usage: Usage | None = None
        request = messages
        conversation_id = options.conversation_id
        for iteration in range(self.max_tool_iterations + 1):
            call_options = dataclasses.replace(options, conversation_id=conversation_id)
            chat: ChatResponse | None = None
            if stream:
                async for chunk in self.client.get_streaming_response(request, options=call_options):
                    if chunk.text:
                        yield AgentResponseUpdate(text=chunk.text)
                    if chunk.response is not None:
                        chat = chunk.response
                if chat is None:
                    raise ModelError("the model's stream ended without a final response; the stream was cut short")
            else:
                chat = await self.client.get_response(request, options=call_options)
            for message in chat.messages:
                if message.author_name is None and self.name:
                    message.author_name = self.name
            produced.extend(chat.messages)
            if chat.usage is not None:
                usage = chat.usage if usage is None else usage + chat.usage
            conversation_id = chat.conversation_id or conversation_id
            for message in chat.messages:
                yield AgentResponseUpdate(message=message)
            calls = [c for m in chat.messages for c in m.function_calls]
            step = list(chat.messages)
            if calls:
                if iteration == self.max_tool_iterations:
                    raise ToolError(
                        f"the model still asked for tools after {self.max_tool_iterations} rounds; raise "
                        "max_tool_iterations if that is expected, or check that the tools' results answer the model"
                    )
                results = await self._call_tools(calls, options.tools)
                produced.append(results)
                step.append(results)
                yield AgentResponseUpdate(message=results)
            if step_store is not None:
                await step_store.store(step)
            if not calls:
                break
            # A service that keeps the conversation needs only what is new; otherwise send everything.
            request = [step[-1]] if service_mode and conversation_id else [*messages, *produced]
        yield AgentResponseUpdate(
            response=AgentResponse(
                messages=produced,
                usage=usage,
                response_id=chat.response_id if chat else None,
                conversation_id=conversation_id if service_mode else None,
            )
        )

    async def _call_tools(self, calls: list[FunctionCallContent], offered: Sequence[FunctionTool]) -> Message:
        tools = {t.name: t for t in offered}
        results: list[FunctionResultContent] = []
        for call in calls:
            target = tools.get(call.name)
            if target is None:
                results.append(
                    FunctionResultContent(
                        call_id=call.call_id, result=f"error: there is no tool named {call.name!r}", is_error=True
                    )
                )
                continue
            try:
                arguments = call.parse_arguments()
                target.validate_arguments(arguments)
            except ValueError as exc:
                # The model's mistake: tell it, so it can correct the call.
                results.append(FunctionResultContent(call_id=call.call_id, result=f"error: {exc}", is_error=True))
                continue
            results.append(FunctionResultContent(call_id=call.call_id, result=await target.invoke(arguments)))
        return Message(role="tool", contents=list(results), author_name=self.name)

    # -- lifecycle -------------------------------------------------------------------------------

    async def close(self) -> None:
        """Close the stores this agent opened itself (from ``history=URL``); safe to call twice.

        After :meth:`run_sync`, they are closed on its private loop (the loop they ran on), which then closes.
        """
        await self._take_loop_thread().astop(self._close_owned())

    async def _close_owned(self) -> None:
        owned, self._owned = self._owned, []
        for provider in owned:
            await provider.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    # -- blocking use: scripts, Flask or Django views, notebooks ---------------------------------

    def run_sync(
        self, input: AgentInput = None, *, session: AgentSession | None = None, options: ChatOptions | None = None
    ) -> AgentResponse:
        """Run the agent like :meth:`run`, blocking until its response: for code that is not async.

        The run happens on a private event loop that the agent makes on first use and keeps, so the stores it
        opened stay on one loop from call to call (the calling thread runs it when it can, else a helper thread
        does). It works from any thread, also from one whose event loop is running (a notebook cell; that loop
        waits meanwhile). :meth:`close_sync` closes the loop.

        Args:
            input: text, a :class:`Message`, or a list of them.
            session: the conversation to continue (a new one when omitted: the run then has no history).
            options: per-run model options (``conversation_id``, ``temperature``...).

        Raises:
            SyncCallError: called from code running on the agent's private loop (a tool of a ``run_sync`` run); await
                :meth:`run` there.
            HistoryModeConflictError: the run mixes service-managed and local history.
            ModelError: the model service failed.
            ToolError: the tool loop did not finish within ``max_tool_iterations``.
        """
        return self._loop_thread.run(self.run(input, session=session, options=options))

    def close_sync(self) -> None:
        """:meth:`close` for code that is not async: close the stores this agent opened, close its private loop.

        Runs in flight on other threads finish first. ``run_sync`` still works afterwards (on a new thread), but
        not with the stores the agent opened from ``history=URL``: they are closed.
        """
        self._take_loop_thread().stop(self._close_owned() if self._owned else None)

    def _take_loop_thread(self) -> LoopThread:
        """The private loop used so far, to stop; later ``run_sync`` calls get a fresh one."""
        loop_thread, self._loop_thread = self._loop_thread, LoopThread(self._loop_thread.name)
        return loop_thread


def _run_outcome(update: AgentResponseUpdate) -> _telemetry.Attributes | None:
    """What the run's last update tells its span: the response id, token usage and how many messages it made."""
    response = update.response
    if response is None:
        return None
    attributes: _telemetry.Attributes = {"chatkeep.messages.produced": len(response.messages)}
    if response.response_id is not None:
        attributes["gen_ai.response.id"] = response.response_id
    if response.usage is not None:
        attributes["gen_ai.usage.input_tokens"] = response.usage.input_tokens
        attributes["gen_ai.usage.output_tokens"] = response.usage.output_tokens
    return attributes


async def _call_hook(
    hook: Any, provider: ContextProvider, agent: Agent, session: AgentSession, context: SessionContext
) -> None:
    """Call a provider hook with its slice of ``session.state`` (attached to the session once it holds something)."""
    state = session.state.get(provider.source_id)
    attach = not isinstance(state, dict)
    if attach:
        state = {}
    await hook(agent=agent, session=session, context=context, state=state)
    if attach and state:
        session.state[provider.source_id] = state


class _PerCallStore:
    """Stores each completed model call with its tool results, for per-call persistence."""

    def __init__(
        self, agent: Agent, session: AgentSession, context: SessionContext, providers: list[ContextProvider]
    ) -> None:
        self.agent = agent
        self.session = session
        self.context = context
        self.providers = [p for p in providers if isinstance(p, HistoryProvider)]
        self.first = True

    async def store(self, step: list[Message]) -> None:
        partial = SessionContext(self.context.input_messages if self.first else [])
        if self.first:
            partial.context_messages = self.context.context_messages
            partial.history_sources = self.context.history_sources
        partial.response = AgentResponse(messages=step)
        for provider in self.providers:
            await _call_hook(provider.after_run, provider, self.agent, self.session, partial)
        self.first = False


class BaseChatClient:
    """Mixin for chat clients: ``client.as_agent(...)`` builds an :class:`Agent` on this client."""

    def as_agent(self, **kwargs: Any) -> Agent:
        """An agent using this client; takes the :class:`Agent` keywords (``name``, ``instructions``...)."""
        return Agent(self, **kwargs)  # type: ignore[arg-type]
