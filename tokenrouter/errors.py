"""Exception types. Every error names what was wrong so a caller can fix it without reading code."""


class TokenRouterError(Exception):
    """Base class of every error this package raises on purpose."""


class InvalidRequestError(TokenRouterError, ValueError):
    """A request's input is invalid; `field` names the offending input."""

    def __init__(self, field: str, message: str):
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")


class ContextLengthExceededError(InvalidRequestError):
    """A prompt does not fit the model's context (with room for one token to generate)."""


class ModelLoadError(TokenRouterError, ValueError):
    """A model could not be found or loaded (missing weights, unsupported architecture, ...)."""


class ModelNotFoundError(ModelLoadError):
    """A model argument is neither a path that exists nor a fetched store model."""

    def __init__(self, where: str, reason: str):
        super().__init__(f"{where}: {reason}")
        self.where = where
        self.reason = reason


class ConfigError(TokenRouterError, ValueError):
    """The engine's configuration is inconsistent (unknown model names in a policy, ...)."""


class EngineNotRunningError(TokenRouterError, RuntimeError):
    """The engine was used before `start()` / `async with`, after `close()`, or after a worker died."""
