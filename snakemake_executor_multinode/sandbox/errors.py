"""The sandbox's one error."""


class ClusterError(RuntimeError):
    """A cluster step failed; the message names the step and the log to read."""
