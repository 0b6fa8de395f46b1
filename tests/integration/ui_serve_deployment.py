"""Serve prefect.yaml's `post-training` deployment with small parameters (for test_ui_browser).

    python tests/integration/ui_serve_deployment.py '<PostTrainingParams as JSON>'

Run with PREFECT_API_URL pointing at a real Prefect server and the TEMPER_* variables of
the test. The entry (name, entrypoint, description, tags) comes from prefect.yaml, as for
`temper up`; only its parameters are replaced by the given small ones, so a Quick run from
the UI finishes in about a minute. Exits non-zero when prefect.yaml has no such entry.
Blocks serving until terminated (SIGTERM/SIGINT).
"""

from __future__ import annotations

import json
import sys

NAME = "post-training"


def main(argv: list[str]) -> int:
    from prefect import serve

    from flows.deployments import load_flow, read_entries
    from temper.lifecycle.params import PostTrainingParams

    params = PostTrainingParams.model_validate(json.loads(argv[0]) if argv else {})
    entry = next((e for e in read_entries() if e.name == NAME), None)
    if entry is None:
        print(f"prefect.yaml has no deployment named {NAME!r}", file=sys.stderr, flush=True)
        return 2
    deployment = load_flow(entry.entrypoint).to_deployment(
        name=entry.name, description=entry.description, tags=entry.tags,
        parameters={"params": params.model_dump(mode="json")})
    print(f"serving {entry.name} ({entry.entrypoint})", flush=True)
    serve(deployment, print_starting_message=False)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
