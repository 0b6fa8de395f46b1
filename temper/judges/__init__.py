"""Judges for open-ended domains: a model scores a response against a per-domain rubric.

``rubric`` is the YAML a person edits, ``parse`` reads a score out of judge text, ``cache``
keeps every judge output on disk by digest (re-scoring is free and reproducible),
``backends`` talk to a local HF folder or an OpenAI-compatible endpoint, ``judge`` ties them
together, ``stats`` and ``calibration`` measure judge-human agreement and gate RL on it,
``labels`` and ``review`` are the human side (Prefect UI form, versioned label dataset).
"""

from temper.core.errors import TemperError


class JudgeError(TemperError):
    """A judge could not score one item (bad output, unreachable endpoint): the item is skipped, not zeroed."""


class JudgeUnavailable(TemperError):
    """The judge cannot score anything (its model folder cannot be loaded): the run stops with this one
    line, instead of skipping every item and reporting a run that judged nothing as a success."""


class UnparseableOutput(JudgeError):
    """The judge answered, but with no score on the rubric's scale."""


class RubricError(TemperError):
    """A rubric file or inline rubric is wrong; errors name the file and the field."""
