"""A bare TRL GRPOTrainer run: the baseline benchmarks/train.py compares temper's GRPO step with.

Standalone on purpose: only trl, transformers and datasets, no temper import. It trains the given
HF model folder on the given rows (JSONL with ``prompt`` and ``record``, the source record as
JSON: benchmarks/train.py dumps exactly the rows temper's GRPO run consumes) with the given
GRPOConfig values (a JSON object of keyword arguments), single process. The reward is a plain
function: 1.0 when the first number of the completion equals the record's ``reference``.

Step timing is measured the way temper's TemperCallback measures it (on_step_begin -> on_step_end,
and num_tokens between two logs), one JSON line per logged step in ``--metrics``.

    python benchmarks/bare_trl_grpo.py --model DIR --rows rows.jsonl --args args.json --metrics out.jsonl
"""

from __future__ import annotations

import argparse
import json
import re
import time

_NUM = re.compile(r"[-+]?\d+(?:\.\d+)?")


def number_reward(prompts, completions, record, **_):
    out = []
    for completion, rec in zip(completions, record):
        ref = json.loads(rec)["reference"]
        m = _NUM.search(completion if isinstance(completion, str) else str(completion))
        try:
            out.append(1.0 if m and abs(float(m.group()) - float(ref)) <= 1e-6 else 0.0)
        except ValueError:
            out.append(0.0)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--rows", required=True)
    ap.add_argument("--args", required=True)
    ap.add_argument("--metrics", required=True)
    a = ap.parse_args()

    import datasets
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    class StepTimes(TrainerCallback):
        def __init__(self) -> None:
            self.t_step = self.t_log = time.perf_counter()
            self.tokens = None

        def on_step_begin(self, args, state, control, **kw):
            self.t_step = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            self.step_time = time.perf_counter() - self.t_step

        def on_log(self, args, state, control, logs=None, **kw):
            logs = dict(logs or {})
            if "loss" not in logs:
                return
            now = time.perf_counter()
            row = {"step": state.global_step, "step_time_s": self.step_time,
                   **{k: float(v) for k, v in logs.items() if isinstance(v, (int, float))}}
            tokens = logs.get("num_tokens")
            if tokens is not None and self.tokens is not None:
                row["tokens_per_s"] = (tokens - self.tokens) / (now - self.t_log)
            self.tokens, self.t_log = tokens, now
            with open(a.metrics, "a") as f:
                f.write(json.dumps(row) + "\n")

    with open(a.rows) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    with open(a.args) as f:
        config = GRPOConfig(**json.load(f))
    tok = AutoTokenizer.from_pretrained(a.model)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32)
    trainer = GRPOTrainer(model=model, args=config, reward_funcs=[number_reward],
                          train_dataset=datasets.Dataset.from_list(rows), processing_class=tok)
    trainer.add_callback(StepTimes())
    trainer.train()
    print(f"bare: done {trainer.state.global_step} steps", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
