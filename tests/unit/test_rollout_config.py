"""Backend selection (embedded | vllm) is a typed section of the one settings model, checked when a client is
made, and the vLLM manifests validate strictly and run `vllm serve` with prefix caching and chunked prefill on a GPU."""

from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from pydantic import ValidationError

from temper.core.settings import RolloutSettings, Settings
from temper.rollout.config import engine_config

ROOT = Path(__file__).resolve().parents[2]
VLLM = ROOT / "k8s" / "vllm"


def test_vllm_backend_needs_a_base_url_and_reads_env(monkeypatch):
    with pytest.raises(ValueError, match="base_url"):
        RolloutSettings(backend="vllm").checked()
    monkeypatch.setenv("TEMPER_ROLLOUT_BACKEND", "vllm")
    monkeypatch.setenv("TEMPER_ROLLOUT_BASE_URL", "http://vllm-rollout.temper.svc:8000/v1")
    s = Settings().rollout.checked()
    assert s.backend == "vllm" and s.base_url.endswith("/v1")


def test_settings_load_with_an_unusable_rollout_section_and_no_backend_is_the_default(monkeypatch):
    """Only a client needs a usable section: a process that never generates starts whatever it says."""
    monkeypatch.setenv("TEMPER_ROLLOUT_BACKEND", "vllm")
    assert Settings().rollout.base_url is None
    monkeypatch.delenv("TEMPER_ROLLOUT_BACKEND")
    assert Settings().rollout.backend is None  # eval jobs then generate with transformers (--generator local)


def test_embedded_backend_needs_a_model_or_a_server(tmp_path):
    with pytest.raises(ValueError, match="model_dir"):
        RolloutSettings(backend="embedded").checked()
    assert RolloutSettings(backend="embedded", base_url="http://127.0.0.1:8000/v1").checked().backend == "embedded"
    cfg = engine_config(RolloutSettings(model_dir=tmp_path, profile="fast").checked())
    assert cfg.profile == "fast" and cfg.speculative.method == "prompt_lookup"  # no draft model needed
    cfg = engine_config(RolloutSettings(model_dir=tmp_path, profile="fast", draft_dir=tmp_path / "d").checked())
    assert cfg.speculative.method == "draft_model" and cfg.speculative.draft_dir == tmp_path / "d"


def test_rollout_section_of_a_yaml_file(tmp_path):
    f = tmp_path / "run.yaml"
    f.write_text("rollout:\n  backend: vllm\n  base_url: http://h:8000/v1\n  model: policy\n")
    s = RolloutSettings.from_yaml(f)
    assert (s.backend, s.base_url, s.model) == ("vllm", "http://h:8000/v1", "policy")
    f.write_text("rollout:\n  backend: sglang\n")
    with pytest.raises(ValidationError, match="backend"):
        RolloutSettings.from_yaml(f)


def _docs():
    return [d for p in sorted(VLLM.glob("*.yaml")) if p.name != "kustomization.yaml"
            for d in yaml.safe_load_all(p.read_text())]


def test_vllm_manifests_validate_strict():
    docs = _docs()
    assert {d["kind"] for d in docs} == {"Deployment", "Service", "PersistentVolumeClaim"}
    for d in docs:
        kubernetes_validate.validate(d, "1.33", strict=True)
    kust = yaml.safe_load((VLLM / "kustomization.yaml").read_text())
    assert sorted(kust["resources"]) == sorted(p.name for p in VLLM.glob("*.yaml") if p.name != "kustomization.yaml")


def test_vllm_deployment_serves_with_prefix_caching_chunked_prefill_on_a_gpu():
    docs = {d["kind"]: d for d in _docs()}
    dep, svc = docs["Deployment"], docs["Service"]
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["command"] == ["vllm", "serve"]
    assert "--enable-prefix-caching" in c["args"] and "--enable-chunked-prefill" in c["args"]
    assert "--served-model-name=temper" in c["args"]  # RolloutSettings.model's default
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert pod["securityContext"]["runAsNonRoot"] and not c["securityContext"]["allowPrivilegeEscalation"]
    assert svc["spec"]["selector"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    port = {p["name"]: p["containerPort"] for p in c["ports"]}["http"]
    assert svc["spec"]["ports"][0]["targetPort"] == "http" and port == 8000
    claim = {v["name"]: v for v in pod["volumes"]}["models"]["persistentVolumeClaim"]["claimName"]
    assert claim == docs["PersistentVolumeClaim"]["metadata"]["name"]
