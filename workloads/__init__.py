"""Programs that run inside pods (or local processes). No Prefect import here."""
