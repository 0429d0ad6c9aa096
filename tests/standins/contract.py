"""What every stand-in library shares: the error for a call the real library would reject, and the
check that a call fits the real function's signature.
"""

from __future__ import annotations

import inspect
from typing import Any


class ContractViolation(AssertionError):
    """The backend used a vendor API in a way the real library would not accept.

    An AssertionError on purpose: the backends catch the libraries' own errors, never this one.
    """


def bind(name: str, sig: inspect.Signature, args: tuple, kwargs: dict[str, Any]) -> inspect.BoundArguments:
    try:
        return sig.bind(*args, **kwargs)
    except TypeError as exc:
        raise ContractViolation(f"{name}{sig}: {exc}") from None
