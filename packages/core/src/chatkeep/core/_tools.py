"""Python functions as tools: a JSON schema from type hints, and a call from the model's JSON arguments."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any, get_type_hints

from pydantic import ConfigDict, TypeAdapter, ValidationError, create_model

from chatkeep.core._errors import InvalidArgumentError

__all__ = ["FunctionTool", "tool"]


def _first_paragraph(doc: str | None) -> str:
    if not doc:
        return ""
    return inspect.cleandoc(doc).split("\n\n", 1)[0].replace("\n", " ").strip()


class FunctionTool:
    """A Python function (sync or async) the model may call.

    The parameters' JSON schema comes from the function's type hints; the description from its
    docstring's first paragraph.

    Args:
        func: the function.
        name: the name the model sees (default: the function's name).
        description: what the tool does (default: the docstring's first paragraph).
    """

    def __init__(self, func: Callable[..., Any], *, name: str | None = None, description: str | None = None) -> None:
        self.func = func
        self.name = name or func.__name__
        self.description = description if description is not None else _first_paragraph(func.__doc__)
        signature = inspect.signature(func)
        hints = get_type_hints(func)
        fields: dict[str, Any] = {}
        for pname, param in signature.parameters.items():
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                continue
            annotation = hints.get(pname, Any)
            default = ... if param.default is param.empty else param.default
            fields[pname] = (annotation, default)
        self._args_model = create_model(
            f"{self.name}_arguments",
            __config__=ConfigDict(extra="forbid"),
            **fields,
        )
        schema = self._args_model.model_json_schema()
        schema.pop("title", None)
        for prop in schema.get("properties", {}).values():
            prop.pop("title", None)
        self.parameters: dict[str, Any] = schema
        return_hint = hints.get("return", Any)
        self._result_adapter: TypeAdapter[Any] = TypeAdapter(return_hint if return_hint is not None else type(None))

    def __repr__(self) -> str:
        return f"FunctionTool({self.name!r})"

    def validate_arguments(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """Check and convert the model's arguments; raises ``ValueError`` naming what is wrong."""
        try:
            model = self._args_model.model_validate(arguments)
        except ValidationError as exc:
            raise ValueError(f"invalid arguments for tool {self.name!r}: {exc}") from exc
        return {name: getattr(model, name) for name in type(model).model_fields}

    async def invoke(self, arguments: dict[str, Any]) -> Any:
        """Call the function with validated arguments and return a JSON-safe result."""
        kwargs = self.validate_arguments(arguments)
        result = self.func(**kwargs)
        if inspect.isawaitable(result):
            result = await result
        try:
            return self._result_adapter.dump_python(result, mode="json")
        except Exception:  # the hint was too loose or wrong: fall back to the value's own JSON form
            return TypeAdapter(Any).dump_python(result, mode="json")

    def to_openai(self) -> dict[str, Any]:
        """The tool in the Chat Completions ``tools`` format."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


def tool(func: Callable[..., Any] | None = None, *, name: str | None = None, description: str | None = None) -> Any:
    """Decorator that turns a function into a :class:`FunctionTool` (usable bare or with arguments)."""

    def wrap(f: Callable[..., Any]) -> FunctionTool:
        return FunctionTool(f, name=name, description=description)

    return wrap(func) if func is not None else wrap


ToolLike = FunctionTool | Callable[..., Any] | Callable[..., Awaitable[Any]]


def as_tools(tools: list[Any] | tuple[Any, ...] | None) -> list[FunctionTool]:
    """Wrap plain functions as :class:`FunctionTool`; refuse duplicates by name."""
    result: list[FunctionTool] = []
    seen: set[str] = set()
    for item in tools or ():
        t = item if isinstance(item, FunctionTool) else FunctionTool(item)
        if t.name in seen:
            raise InvalidArgumentError(f"two tools are named {t.name!r}; give one a different name with tool(name=...)")
        seen.add(t.name)
        result.append(t)
    return result
