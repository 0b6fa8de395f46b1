"""What the lifecycle flows share that is not a Prefect task: their typed parameters, dataset
validation against data contracts, the report, eval records in MLflow, and the retraining decision."""
