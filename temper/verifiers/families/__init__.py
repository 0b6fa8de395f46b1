"""Every verifier family; importing this package registers them all."""

from temper.verifiers.families import doc_qa, episode, judge, matching, programs, reasoning_gym, structured  # noqa: F401
