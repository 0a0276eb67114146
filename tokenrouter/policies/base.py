"""What every routing policy declares: the models it uses and the one a request starts on."""

from __future__ import annotations

from abc import ABC, abstractmethod


class Policy(ABC):
    @property
    @abstractmethod
    def models(self) -> list[str]:
        """Names of the models this policy routes between, as keys of `Engine(models=...)`."""

    @property
    @abstractmethod
    def entry_model(self) -> str:
        """The model every request starts on."""
