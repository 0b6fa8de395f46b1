"""The names a domain's ``verifier.family`` may take, and nothing else.

A leaf on purpose: ``Domain`` checks a family name on every domain file the catalog loads, and
the families themselves (``temper.verifiers.families``) import judges, the sandbox and
reasoning_gym. Loading a catalog must not cost that, nor may the data room import the verifier
room above it. ``tests/unit/test_verifiers_families.py`` holds this set equal to the families
``temper.verifiers.families.FAMILIES`` lists.
"""

VERIFIER_FAMILIES = frozenset({
    "code_tests",
    "doc_qa",
    "episode",
    "exact",
    "json_extraction",
    "judge",
    "numeric",
    "reasoning_gym",
    "terminal",
    "tool_call",
})
