"""What temper records in MLflow, by concern: ``connection`` (where the store is, retrying while a server
is away), ``runs`` (opening, resuming and finding again the runs of a lifecycle) and ``tree`` (walking a
version or run back to its parents and datasets). Tag names are ``temper.core.tag_names``.

Nothing is imported here, so each concern loads only what it needs.
"""
