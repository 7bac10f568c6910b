"""The one error allocation raises."""


class AllocationError(Exception):
    """The claim cannot be allocated now; the message names the request and what failed."""
