"""What a running engine lends to tests, and only to them: its workers, what each model loaded as
(the torch module included), and how many requests it follows.

`Engine` keeps these private: a caller reads `info()`, `stats()` and `health()`. When it starts it
lends them here (`lend`), and takes them back when it closes (`take_back`); tests, the fault
helpers (`faults.py`) and benchmarks that time a model's own forward read them through
`workers_of(engine)`, `loaded_model(engine, name)` and `requests_in_flight(engine)`. An engine not
running lends nothing: no workers, no requests.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from ..engine import LoadedModel, Worker


@dataclass(frozen=True)
class LentParts:
    workers: Mapping[str, Worker]  # read-only views of the engine's own mappings
    loaded: Mapping[str, LoadedModel]
    requests_in_flight: Callable[[], int]


# by engine; what is lent refers back to the engine (its workers deliver to it) until it takes it back
_LENT: weakref.WeakKeyDictionary[Any, LentParts] = weakref.WeakKeyDictionary()


def lend(engine: Any, workers: Mapping[str, Worker], loaded: Mapping[str, LoadedModel], requests_in_flight) -> None:
    """Called by the engine once it has started."""
    _LENT[engine] = LentParts(MappingProxyType(workers), MappingProxyType(loaded), requests_in_flight)


def take_back(engine: Any) -> None:
    """Called by the engine as it closes."""
    _LENT.pop(engine, None)


def workers_of(engine: Any) -> Mapping[str, Worker]:
    """The running engine's worker per model (a `WorkerThread`, or a `RemoteWorker` for a model in a
    Ray actor); empty when the engine is not running."""
    parts = _LENT.get(engine)
    return parts.workers if parts is not None else MappingProxyType({})


def loaded_model(engine: Any, model: str) -> LoadedModel:
    """What `model` loaded as in the running engine: its torch module, tokenizer, dtypes, kernels."""
    parts = _LENT.get(engine)
    if parts is None:
        raise KeyError(f"the engine is not running, so model {model!r} is not loaded")
    return parts.loaded[model]


def requests_in_flight(engine: Any) -> int:
    """Requests the engine has submitted and not yet seen end; 0 when it is not running."""
    parts = _LENT.get(engine)
    return parts.requests_in_flight() if parts is not None else 0
