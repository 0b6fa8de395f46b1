"""Verifier families: score a completion against a record, reward in [0, 1] or None."""

from temper.verifiers.base import Verdict, Verifier
from temper.verifiers.registry import get_verifier

__all__ = ["Verdict", "Verifier", "get_verifier"]
