"""Typed errors for user mistakes and bad inputs: the CLI prints a LocalchatError as one line
and exits with its exit_code, never a traceback. Anything else is a bug."""


class LocalchatError(Exception):
    """Base class: a problem we can explain to the user in one line."""

    exit_code = 1


class UsageError(LocalchatError):
    """Bad command-line arguments or an unparseable model SPEC."""

    exit_code = 2


class ConfigError(UsageError):
    """A setting's value is refused. `setting` names it as the engine's config does
    (ctx_size); front ends say it their way (the CLI as -c/--ctx-size). str(): 'setting problem'."""

    def __init__(self, setting: str, problem: str) -> None:
        super().__init__(f"{setting} {problem}")
        self.setting, self.problem = setting, problem


class ConstraintError(UsageError):
    """A JSON schema or grammar for structured output that cannot be used (llguidance's
    reason)."""


class ModelNotFoundError(LocalchatError):
    """The model file or hub reference does not exist (or is not downloaded)."""


class ModelFormatError(LocalchatError):
    """The file exists but is not a usable model (wrong magic, truncated, corrupt)."""


class UnsafeCheckpointError(ModelFormatError):
    """A pickle-based checkpoint: refused, never unpickled."""


class HubError(LocalchatError):
    """Downloading from or resolving against the Hugging Face hub failed."""


class TemplateError(LocalchatError):
    """The chat template is unsafe, broken, or too expensive to render."""


class ContextOverflowError(LocalchatError):
    """The prompt does not fit in the model's context window."""


class EngineError(LocalchatError):
    """The inference engine failed to load or run the model."""
