"""Rubrics, score parsing, the judge (tiny local model + fake endpoint), the cache, the judge verifier family."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from temper.judges import JudgeError, JudgeUnavailable, RubricError, UnparseableOutput
from temper.judges.judge import Judge, JudgeSpec
from temper.judges.parse import ScoreParseError, parse_score
from temper.judges.rubric import Rubric, Scale, load_rubric, resolve_rubric

REPO = Path(__file__).resolve().parents[2]
RUBRIC = {"name": "t", "criteria": [{"name": "c", "description": "good"}], "scale": {"min": 1, "max": 5}}


@pytest.fixture(scope="module")
def tiny(tiny_model) -> str:
    return tiny_model()


# ---- rubrics ----------------------------------------------------------------------------------

def test_shipped_rubric_loads_and_digest_is_stable():
    r = resolve_rubric("summaries")
    assert r.scale.points == [1, 2, 3, 4, 5] and {c.name for c in r.criteria} >= {"faithfulness", "coverage"}
    assert r.calibration.min_spearman == 0.6
    assert r.digest == resolve_rubric(str(REPO / "rubrics" / "summaries.yaml")).digest
    changed = r.model_copy(update={"description": "other"})
    assert changed.digest != r.digest
    assert r.model_copy(update={"calibration": r.calibration.model_copy(update={"min_n": 5})}).digest == r.digest


def test_malformed_rubric_names_file_and_line(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("name: x\ncriteria: [unclosed\n")
    with pytest.raises(RubricError, match=r"bad\.yaml.*line \d+.*malformed YAML"):
        load_rubric(p)


@pytest.mark.parametrize("patch,match", [
    ({"scale": {"min": 5, "max": 5}}, r"field 'scale'.*max \(5\) must be greater than min"),
    ({"examples": [{"prompt": "p", "response": "r", "score": 9}]}, r"field 'examples'.*examples\[0\]\.score 9 lies outside \[1, 5\]"),
    ({"criteria": []}, r"field 'criteria'"),
    ({"scorez": 1}, r"field 'scorez'"),
])
def test_bad_rubric_fields_name_file_and_field(tmp_path, patch, match):
    p = tmp_path / "r.yaml"
    p.write_text(yaml.safe_dump({**RUBRIC, **patch}))
    with pytest.raises(RubricError, match=r"r\.yaml: " + match):
        load_rubric(p)


def test_unknown_rubric_name_is_a_clear_error():
    with pytest.raises(RubricError, match=r"nope\.yaml: cannot read rubric"):
        resolve_rubric("nope")


# ---- parsing ----------------------------------------------------------------------------------

S = Scale(min=1, max=5)


@pytest.mark.parametrize("text,raw,rationale", [
    ("Clear and faithful.\nScore: 4/5", 4.0, "Clear and faithful."),
    ("score = 2", 2.0, ""),
    ('blah {"score": 5, "rationale": "complete"} trailing', 5.0, "complete"),
    ("Score: 1/5 at first... on reflection Score: **3**/5", 3.0, "Score: 1/5 at first... on reflection"),
    ("Score: 3.5/5", 3.5, ""),
])
def test_parse_score(text, raw, rationale):
    p = parse_score(text, S)
    assert (p.raw, p.rationale) == (raw, rationale)


@pytest.mark.parametrize("text,match", [
    ("I like it a lot", "no 'Score: N' line"),
    ("Score: 7/10", "out of 10, the rubric scale is 1..5"),
    ("Score: 9", "outside the rubric scale 1..5"),
    ("Score: 0/5", "outside the rubric scale"),
    ('{"score": true}', "not a number"),
    ('{"score": "high"}', "not a number"),
])
def test_unparseable_scores_are_errors_not_guesses(text, match):
    with pytest.raises(ScoreParseError, match=match):
        parse_score(text, S)


def test_scale_binning_is_half_up():
    assert [S.to_point(x) for x in (0.0, 0.125, 0.25, 0.375, 0.999, 1.0)] == [1, 2, 2, 3, 5, 5]
    assert S.normalize(4) == pytest.approx(0.75)


# ---- the judge with a tiny local model ----------------------------------------------------------

def test_judge_spec_needs_exactly_one_source():
    with pytest.raises(ValueError, match="exactly one of judge.model"):
        JudgeSpec()
    with pytest.raises(ValueError, match="needs judge.endpoint_model"):
        JudgeSpec(base_url="http://x")
    with pytest.raises(ValueError, match="local judge.model only"):
        JudgeSpec(base_url="http://x", endpoint_model="m", scoring="choice")


def test_tiny_judge_is_deterministic_and_cached(tiny, temper_home):
    rubric = Rubric.model_validate(RUBRIC)
    first = Judge({"model": tiny, "scoring": "choice", "max_new_tokens": 8})
    a = first.score(rubric, "Summarize: the cat sat.", "A cat sat.", item_id="x1")
    assert first.stats == {"cache_hits": 0, "judged": 1, "unparseable": 0} and not a.cached
    assert 0.0 <= a.score <= 1.0 and a.raw_score in {1.0, 2.0, 3.0, 4.0, 5.0}
    cache_file = temper_home / "judge_cache" / a.digest[:2] / f"{a.digest}.json"
    entry = json.loads(cache_file.read_text())
    assert entry["digest"] == a.digest and entry["item_id"] == "x1" and entry["judge"] == a.judge_id

    second = Judge({"model": tiny, "scoring": "choice", "max_new_tokens": 8})  # a fresh judge: only the disk is shared

    def no_model(*_a, **_k):
        raise AssertionError("a cached item must not run the model")

    second.backend.generate = second.backend.choose = no_model
    b = second.score(rubric, "Summarize: the cat sat.", "A cat sat.", item_id="x1")
    assert second.stats == {"cache_hits": 1, "judged": 0, "unparseable": 0} and b.cached
    assert (b.score, b.raw_score, b.rationale, b.digest) == (a.score, a.raw_score, a.rationale, a.digest)

    # Greedy means the same output again even without the cache.
    cache_file.unlink()
    c = Judge({"model": tiny, "scoring": "choice", "max_new_tokens": 8}).score(
        rubric, "Summarize: the cat sat.", "A cat sat.", item_id="x1")
    assert (c.score, c.rationale) == (a.score, a.rationale) and not c.cached
    # Any input change is another digest.
    assert first.digest(rubric, "Summarize: the cat sat.", "A dog sat.") != a.digest
    assert first.digest(rubric.model_copy(update={"description": "d"}), "Summarize: the cat sat.", "A cat sat.") != a.digest


def test_unparseable_judge_output_names_item_and_is_cached(tiny, temper_home):
    rubric = Rubric.model_validate(RUBRIC)
    judge = Judge({"model": tiny, "scoring": "generate", "max_new_tokens": 8})  # a random model never writes 'Score:'
    for expected in ({"cache_hits": 0, "judged": 1, "unparseable": 1}, {"cache_hits": 1, "judged": 1, "unparseable": 2}):
        with pytest.raises(UnparseableOutput, match=r"item doc-7 \(rubric t, judge output [0-9a-f]{12}\): no 'Score: N'"):
            judge.score(rubric, "p", "r", item_id="doc-7")
        assert judge.stats == expected


def test_judge_fingerprint_changes_with_weights(tiny, tmp_path):
    import shutil

    from temper.judges.backends import folder_fingerprint

    copy = shutil.copytree(tiny, tmp_path / "copy")
    assert folder_fingerprint(copy) == folder_fingerprint(tiny)
    (copy / "config.json").write_text((copy / "config.json").read_text() + " ")
    assert folder_fingerprint(copy) != folder_fingerprint(tiny)
    with pytest.raises(JudgeUnavailable, match="not a Hugging Face model folder"):
        folder_fingerprint(tmp_path)


# ---- the judge over an OpenAI-compatible endpoint ---------------------------------------------

@pytest.fixture
def endpoint():
    """A stand-in OpenAI-compatible server: POST /v1/completions, answers from ``state['reply']``."""
    state = {"reply": "Faithful and short.\nScore: 4/5", "status": 200, "requests": []}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            state["requests"].append((self.path, body, self.headers.get("Authorization")))
            out = json.dumps({"id": "c", "object": "text_completion", "created": 0, "model": body["model"],
                              "choices": [{"index": 0, "text": state["reply"], "finish_reason": "stop",
                                           "logprobs": None}]}).encode()
            self.send_response(state["status"])
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *_):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    state["url"] = f"http://127.0.0.1:{server.server_address[1]}"
    yield state
    server.shutdown()


@pytest.mark.parametrize("client", ["openai", "requests"])
def test_endpoint_judge_greedy_and_cached(endpoint, temper_home, monkeypatch, client):
    pytest.importorskip("openai") if client == "openai" else None
    monkeypatch.setenv("JUDGE_KEY", "sekrit")
    rubric = Rubric.model_validate(RUBRIC)
    spec = {"base_url": endpoint["url"], "endpoint_model": "judge-7b", "client": client, "api_key_env": "JUDGE_KEY"}
    r = Judge(spec).score(rubric, "p", "r", item_id="e1")
    assert (r.score, r.raw_score, r.rationale) == (pytest.approx(0.75), 4.0, "Faithful and short.")
    assert r.judge_id == f"endpoint:{endpoint['url']}/v1#judge-7b"
    path, body, auth = endpoint["requests"][0]
    assert path == "/v1/completions" and body["temperature"] == 0 and body["model"] == "judge-7b"
    assert auth == "Bearer sekrit" and body["prompt"].endswith("Rationale:")
    again = Judge(spec).score(rubric, "p", "r", item_id="e1")
    assert again.cached and len(endpoint["requests"]) == 1 and again.score == r.score


def test_endpoint_failure_names_item(endpoint, temper_home):
    endpoint["status"] = 500
    judge = Judge({"base_url": endpoint["url"] + "/v1", "endpoint_model": "m", "client": "requests"})
    with pytest.raises(JudgeError, match=r"item e2 \(rubric t\): judge endpoint .*/v1 failed: HTTPError"):
        judge.score(Rubric.model_validate(RUBRIC), "p", "r", item_id="e2")


# ---- the verifier family ----------------------------------------------------------------------

def test_judge_family_is_registered_and_validates_params(tiny):
    from temper.verifiers import get_verifier
    from temper.verifiers.families import FAMILIES

    assert "judge" in {cls.family for cls in FAMILIES}
    with pytest.raises(RubricError, match=r"inline rubric 't': field 'scale'"):
        get_verifier("judge", {"rubric": {**RUBRIC, "scale": {"min": 3, "max": 1}}, "judge": {"model": tiny}})
    with pytest.raises(RubricError, match=r"judge verifier params: field 'judge'"):
        get_verifier("judge", {"rubric": RUBRIC})


def test_judge_verifier_scores_or_skips_and_counts(tiny, temper_home, endpoint):
    from temper.verifiers import get_verifier

    params = {"rubric": RUBRIC, "prompt_template": "Summarize: {document}", "reference_field": "reference",
              "judge": {"base_url": endpoint["url"], "endpoint_model": "m", "client": "requests"}}
    v = get_verifier("judge", params)
    rec = {"id": "s1", "document": "doc", "reference": "ref"}
    verdict = v.score(rec, "resp")
    assert verdict.reward == pytest.approx(0.75) and verdict.details["raw_score"] == 4.0
    assert "Reference answer:\nref" in endpoint["requests"][0][1]["prompt"]
    endpoint["reply"] = "no idea"
    assert v.score({**rec, "id": "s2"}, "other") is None
    assert v.score({"id": "s3"}, "x") is None
    assert v.skipped == {"unparseable": 1, "missing_column": 1}
    assert [s["item"] for s in v.skips] == ["s2", "s3"] and "item s2" in v.skips[0]["reason"]
    assert v.score(rec, "resp").reward == pytest.approx(0.75)  # cached verdict, endpoint not asked again
    assert len(endpoint["requests"]) == 2


def test_summaries_generator_spans_the_rubric():
    from temper.data.generators import generate

    df = generate("summaries", 200, 0, 0.1, {})
    assert df.equals(generate("summaries", 200, 0, 0.1, {})) and not df.equals(generate("summaries", 200, 1, 0.1, {}))
    assert df["id"].is_unique and 0.03 < (df["split"] == "eval").mean() < 0.2
    assert set(df["candidate_quality"]) == {1, 2, 3, 4, 5}
    best = df[df["candidate_quality"] == 5]
    assert (best["candidate"] == best["reference"]).all()
    assert not (df[df["candidate_quality"] < 5]["candidate"] == df[df["candidate_quality"] < 5]["reference"]).any()
