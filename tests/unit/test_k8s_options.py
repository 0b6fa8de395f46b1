"""The cluster options file: one loader (YAML -> KubernetesOptions), errors that name the file and
the field, the TEMPER_K8S_OPTIONS lookup flow-run pods use, and `temper k8s options`."""

from __future__ import annotations

import pytest

from infra.k8s.errors import KubernetesError
from infra.k8s.options import OPTIONS_ENV, KubernetesOptions, load_options, options_from_env
from infra.k8s.render import load_render_config
from temper.cli import main


def test_loads_a_valid_file(tmp_path):
    p = tmp_path / "options.yaml"
    p.write_text("namespace: ml\ntolerations:\n  - {key: nvidia.com/gpu}\nqueue_name: gpu\n")
    opts = load_options(p)
    assert opts.namespace == "ml" and opts.tolerations[0].operator == "Exists" and opts.queue_name == "gpu"
    assert opts.sandbox_memory == KubernetesOptions().sandbox_memory  # unset fields keep their defaults


@pytest.mark.parametrize("text,expect", [
    ("namepsace: ml\n", r"options\.yaml: namepsace: Extra inputs are not permitted \(1 error"),
    ("rendezvous_port: 99999\nsandbox_lifetime_s: 5\n",
     r"rendezvous_port: Input should be less than or equal to 65535; sandbox_lifetime_s: .*greater than or equal "
     r"to 60 \(2 error"),
    ("tolerations:\n  - {operator: Exists}\n", r"tolerations\.0\.key: Field required"),
    ("- just\n- a list\n", r"expected a mapping of fields, got list"),
    ("namespace: [unclosed\n", r"not valid YAML"),
])
def test_errors_name_the_file_and_every_bad_field(tmp_path, text, expect):
    p = tmp_path / "options.yaml"
    p.write_text(text)
    with pytest.raises(KubernetesError, match=expect) as e:
        load_options(p)
    assert str(p) in str(e.value)


def test_missing_file_and_empty_file(tmp_path):
    with pytest.raises(KubernetesError, match="kubernetes options .*: file not found"):
        load_options(tmp_path / "nope.yaml")
    (tmp_path / "empty.yaml").write_text("")
    assert load_options(tmp_path / "empty.yaml") == KubernetesOptions()


def test_render_config_goes_through_the_same_loader(tmp_path):
    p = tmp_path / "run.yaml"
    p.write_text("job: {name: x, kind: train, command: ['true']}\nkubernetes: {namespce: a}\n")
    with pytest.raises(KubernetesError, match=r"render config .*: kubernetes\.namespce: Extra inputs"):
        load_render_config(p)


def test_options_from_env(tmp_path):
    assert options_from_env({}) == KubernetesOptions()
    p = tmp_path / "o.yaml"
    p.write_text("namespace: from-env\n")
    assert options_from_env({OPTIONS_ENV: str(p)}).namespace == "from-env"
    with pytest.raises(KubernetesError, match="file not found"):
        options_from_env({OPTIONS_ENV: str(tmp_path / "gone.yaml")})


def test_cli_prints_effective_options_or_the_error(tmp_path, capsys, monkeypatch):
    p = tmp_path / "o.yaml"
    p.write_text("namespace: ml\n")
    assert main(["k8s", "options", "--file", str(p)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"# effective KubernetesOptions from {p}") and "namespace: ml\n" in out
    assert "sandbox_lifetime_s: 3600\n" in out
    monkeypatch.setenv(OPTIONS_ENV, str(p))
    assert main(["k8s", "options"]) == 0 and f"{OPTIONS_ENV}={p}" in capsys.readouterr().out
    p.write_text("namespace: 3\n")
    assert main(["k8s", "options", "--file", str(p)]) == 1
    assert "namespace: Input should be a valid string" in capsys.readouterr().err
