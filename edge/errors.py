"""Errors a user can act on.

Every message says what was wrong and what to do; callers (CLIs, the server) print the message and exit without a
traceback.
"""


class EdgeError(Exception):
    """Base class: an error caused by input the user can fix."""


class ModelFormatError(EdgeError):
    """A model file is corrupt, truncated, foreign, or of an architecture edge does not support."""


class PackageError(EdgeError):
    """An edge model package is missing files, fails its checksums, or points outside its folder."""


class ContextOverflowError(EdgeError):
    """A prompt (or prompt plus generation) does not fit in the planned context."""


class EmptyPromptError(EdgeError, ValueError):
    """A prompt with no tokens: there is nothing to continue from (also a ValueError, what it was before)."""


class ChatTemplateError(EdgeError):
    """The model's chat template failed to render or is unsafe."""


class DeviceError(EdgeError):
    """The requested device (e.g. CUDA) is not available."""
