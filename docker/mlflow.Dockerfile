# The MLflow tracking server of k8s/base/mlflow.yaml: the official image plus the drivers it
# lacks for an S3 artifact store (boto3) and a PostgreSQL backend store (psycopg2).
#   docker build -f docker/mlflow.Dockerfile -t temper-mlflow:3.17.2 docker/
# The server version matches the client pinned in pyproject.toml (mlflow==3.17.2), and boto3
# matches its pin too, so runs logged by temper and the server agree on the schema.
FROM ghcr.io/mlflow/mlflow:v3.17.2
RUN pip install --no-cache-dir --disable-pip-version-check boto3==1.43.117 psycopg2-binary==2.9.13
# Non-root, read-only root filesystem (the pod mounts /mlflow and /tmp).
USER 1000:1000
WORKDIR /mlflow
ENV HOME=/tmp PYTHONDONTWRITEBYTECODE=1
