"""The one exception type of the CDI library."""


class CDIError(ValueError):
    """A CDI name, spec or file is invalid, or a device cannot be resolved.

    Messages name the offending value and the rule it breaks, so they can be shown to users as-is.
    """
