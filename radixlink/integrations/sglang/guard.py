"""Entry points SGLang calls never raise into its scheduler: any exception is logged and the
call answers its miss or failure value (nothing restorable, not queued, not stored).

Owns the catch-log-answer wrapper and the rule of what each entry answers. Must not import
SGLang. Startup (constructors, pool registration) is not wrapped: a bad config must stop the
engine there, with its message.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from radixlink.errors import StoreError

logger = logging.getLogger(__name__)

_F = TypeVar("_F", bound=Callable[..., Any])


def never_raises(fallback: Callable[..., Any]) -> Callable[[_F], _F]:
    """Wrap an engine-facing method: an exception becomes ``fallback(*args, **kwargs)`` (the
    method's own arguments, without ``self``), logged with its traceback.

    Args:
        fallback: builds the answer that means "miss" / "failed" for this call, e.g.
            ``lambda keys, *_, **__: [False] * len(keys)``.
    """

    def wrap(method: _F) -> _F:
        @functools.wraps(method)
        def guarded(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return method(self, *args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - nothing may reach SGLang's scheduler
                answer = fallback(*args, **kwargs)
                logger.warning(
                    "radixlink %s.%s failed (%s: %s); answering %r instead",
                    type(self).__name__, method.__name__, type(exc).__name__, exc,
                    _short(answer), exc_info=not isinstance(exc, StoreError),
                )  # NOTE: a store failure is expected; anything else is a bug: its traceback
                return answer

        return guarded  # type: ignore[return-value]

    return wrap


def _short(answer: Any) -> Any:
    if isinstance(answer, list) and len(answer) > 4:
        return f"[{answer[0]!r}] * {len(answer)}"
    return answer


def nothing(*_: Any, **__: Any) -> None:
    return None


def false(*_: Any, **__: Any) -> bool:
    return False


def zero(*_: Any, **__: Any) -> int:
    return 0


def empty_list(*_: Any, **__: Any) -> list[Any]:
    return []


def false_per_key(keys: Any, *_: Any, **__: Any) -> list[bool]:
    """One ``False`` per key of the call's first argument."""
    return [False] * len(keys or ())
