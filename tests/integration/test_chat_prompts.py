"""A single-turn prompt reaches the model in its chat template, the same text in training and in eval.

SmolLM2-135M-Instruct fed a bare question continues it as text; in its template it answers. Before this,
training rows and the eval job used the bare text, so an instruct model was trained and judged off its
format (and a model without a template must still get the text as it is).
"""

from __future__ import annotations

from pathlib import Path


def test_training_rows_and_eval_prompts_are_the_same_chat_formatted_text(temper_home, tiny_model, tmp_path):
    from transformers import AutoTokenizer

    from temper.cli import main
    from temper.core.chat import chat_prompt
    from temper.core.settings import get_settings
    from temper.data.catalog import load_catalog
    from temper.data.datasets import load_dataset
    from temper.training.config import TrainConfig
    from temper.training.run import row_renderer
    from workloads.evaluate import evaluate_domain

    assert main(["data", "generate", "--domain", "arithmetic"]) == 0
    model = tiny_model()
    result = evaluate_domain(model, "arithmetic", limit=3, max_new_tokens=2)

    domain = load_catalog(get_settings().catalog_dir)["arithmetic"]
    frame = load_dataset(domain, get_settings()).frame
    held_out = frame[frame[domain.split.column] == domain.split.eval].reset_index(drop=True)
    tok = AutoTokenizer.from_pretrained(model)
    expected = chat_prompt(tok, domain.render_prompt(held_out.iloc[0].to_dict()))
    assert expected.startswith("user: ") and expected.endswith("\nassistant: ")  # the tiny model's template
    assert result.samples[0]["prompt"] == expected[-200:]

    cfg = TrainConfig(mode="grpo", run_name="rows", base_model=model, domains=["arithmetic"],
                      output_dir=str(tmp_path / "rows"))
    row = row_renderer(cfg, [domain], {"arithmetic": held_out}, tok)("arithmetic", 0)
    assert row["prompt"] == expected


def test_a_tokenizer_without_a_chat_template_gets_the_text_as_it_is(tiny_model, tmp_path):
    from transformers import AutoTokenizer

    from temper.core.chat import chat_prompt

    tok = AutoTokenizer.from_pretrained(tiny_model())
    tok.chat_template = None
    assert chat_prompt(tok, "2 + 2 =") == "2 + 2 ="
    plain = Path(tmp_path / "plain")
    tok.save_pretrained(plain)
    assert chat_prompt(AutoTokenizer.from_pretrained(plain), "2 + 2 =") == "2 + 2 ="
