"""Domains and their data: the catalog and domain packs, dataset generation and digests, and public
benchmark adapters (``formats``). Validation against data contracts is ``temper.lifecycle.validation``
(it also checks each domain's verifier params, so it sits above the verifiers)."""
