"""The tools the model may call: plain typed functions.

``Toolbox`` builds each tool's JSON Schema from the signature and the docstring's ``Args:``
section, checks the model's arguments against it, and turns any exception into a tool message
the model can read. Add a tool by writing a function here and listing it in ``agent.py``.
"""

from __future__ import annotations


def add(a: float, b: float) -> float:
    """Add two numbers.

    Args:
        a: The first addend.
        b: The second addend.
    """
    return a + b


def subtract(a: float, b: float) -> float:
    """Subtract b from a.

    Args:
        a: The number to subtract from.
        b: The number to subtract.
    """
    return a - b


def multiply(a: float, b: float) -> float:
    """Multiply two numbers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return a * b


def divide(a: float, b: float) -> float:
    """Divide a by b.

    Args:
        a: The dividend.
        b: The divisor; must not be zero.
    """
    if b == 0:
        raise ValueError("division by zero")
    return a / b
