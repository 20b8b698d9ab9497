"""The task family's one-line user error (its own module: the grader worker raises it too)."""
from ..errors import FtisError


class TaskError(FtisError, ValueError):
    """A task could not be built or asked: a bad option, a missing file, an unknown prompt id."""
