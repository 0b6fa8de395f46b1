"""Domains and their data: the catalog and domain packs, dataset generation and digests, public
benchmark adapters (``formats``), and validation against data contracts."""
