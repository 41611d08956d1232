"""The exceptions the Granary client raises.

Every one derives from :class:`GranaryError`, and also from the built-in exception a caller would
catch for that kind of failure (``ConnectionError`` for an unreachable dispatcher, ``LookupError``
for an unknown pipeline, ``ValueError`` for bad arguments and checkpoints). The message is the
client's one text, the same the ``granary`` command prints: what failed, then each cause that adds
something, said once (joined with ``": "``), with the dispatcher's own text when it refused a call.
"""

from __future__ import annotations


class GranaryError(Exception):
    """A Granary client failure."""

    #: The gRPC status code name (``"NotFound"``, ``"FailedPrecondition"``, ...) when the
    #: dispatcher refused a call, else ``None``.
    code: str | None = None


class ConfigurationError(GranaryError, ValueError):
    """Arguments that cannot work: no dispatcher address (pass one or set ``GRANARY_DISPATCHER``),
    a malformed address, an empty pipeline name, an unknown mode."""


class DispatcherUnavailable(GranaryError, ConnectionError):
    """The dispatcher could not be reached: connection refused, timed out, or it went away."""


class PipelineNotFound(GranaryError, LookupError):
    """The dispatcher has no pipeline (or job) of that name. Locally the name is the manifest's
    ``metadata.name``; under Kubernetes it is ``namespace/name``."""


class RequestRefused(GranaryError):
    """The dispatcher refused a call for another reason; see :attr:`GranaryError.code`."""


class InvalidPosition(GranaryError, ValueError):
    """A checkpoint that cannot be decoded, or does not fit this pipeline or job."""


class DataError(GranaryError):
    """A batch or epoch plan the client cannot use, or every worker stream stopped."""


class PipelineFailed(GranaryError):
    """The pipeline failed on the service side, e.g. a stage (your ``python.map`` function among
    them) failed on the same split every time it was tried; the message names the stage, the
    element and, for Python stages, ends with the traceback."""


__all__ = [
    "ConfigurationError",
    "DataError",
    "DispatcherUnavailable",
    "GranaryError",
    "InvalidPosition",
    "PipelineFailed",
    "PipelineNotFound",
    "RequestRefused",
]
