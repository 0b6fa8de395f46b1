"""The lifecycle as Prefect flows. Each file reads top to bottom as the DAG it runs."""
