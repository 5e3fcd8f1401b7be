"""One exception type for every bad input the control plane refuses."""


class FakeNvmlError(Exception):
    """Bad input or state: the message is one line a person can act on."""
