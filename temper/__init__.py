"""temper: the post-training lifecycle of LLMs as Prefect DAGs."""

__version__ = "0.1.0"
