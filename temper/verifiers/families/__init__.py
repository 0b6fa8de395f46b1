"""Every verifier family; importing this package registers them all."""

from temper.verifiers.families import (  # noqa: F401
    doc_qa,
    episode,
    judge,
    matching,
    programs,
    reasoning_gym,
    structured,
)
