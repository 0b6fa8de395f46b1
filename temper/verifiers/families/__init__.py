"""Every verifier family, in the one list the registry reads (``temper.verifiers.registry``).

A family is registered by being named in ``FAMILIES``, not by being imported; its name must also
be in ``temper.data.verifier_families.VERIFIER_FAMILIES``, the leaf that ``Domain`` checks names
against without importing a family (tests/unit/test_verifiers_families.py holds the two equal).
"""

from temper.verifiers.base import Verifier
from temper.verifiers.families.doc_qa import DocQAVerifier
from temper.verifiers.families.episode import EpisodeVerifier
from temper.verifiers.families.judge import JudgeVerifier
from temper.verifiers.families.matching import ExactVerifier, NumericVerifier
from temper.verifiers.families.programs import CodeTestsVerifier, TerminalVerifier
from temper.verifiers.families.reasoning_gym import ReasoningGymVerifier
from temper.verifiers.families.structured import JSONExtractionVerifier, ToolCallVerifier

FAMILIES: tuple[type[Verifier], ...] = (
    NumericVerifier,
    ExactVerifier,
    JSONExtractionVerifier,
    ToolCallVerifier,
    DocQAVerifier,
    CodeTestsVerifier,
    TerminalVerifier,
    ReasoningGymVerifier,
    EpisodeVerifier,
    JudgeVerifier,
)
