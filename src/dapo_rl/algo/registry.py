"""Named registries of algorithm pieces (verl's `register_adv_est` / `register_policy_loss` idea): a new advantage
estimator or policy loss is one decorated function, selected by name in the config."""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

F = TypeVar("F", bound=Callable)


class Registry(dict, Generic[F]):
    """Functions by name.

    Args:
        kind: what is registered, for messages (`advantage estimator`).
    """

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind

    def register(self, name: str) -> Callable[[F], F]:
        """Decorator: register the function under `name`.

        Raises:
            ValueError: `name` is taken.
        """

        def deco(fn: F) -> F:
            if name in self:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self[name] = fn
            return fn

        return deco

    def lookup(self, name: str) -> F:
        """The function registered as `name`.

        Raises:
            ValueError: unknown name (the message lists the registered ones).
        """
        if name not in self:
            raise ValueError(f"unknown {self.kind} {name!r}; registered: {', '.join(sorted(self))}")
        return self[name]
