"""reasoning_gym: a completion scored by the reasoning-gym task's own ``score_answer``, in the sandbox.

The answer is taken from the completion as reasoning-gym expects (its ``extract_answer``: the
last ``<answer>...</answer>``, stripped) and scored against the row's stored entry (question,
answer, metadata) by ``get_score_answer_fn(task)``, so on ``<answer>X</answer>`` temper's reward
equals ``score_answer(X, entry)``. Several scorers ``eval()`` the answer (string_insertion,
spiral_matrix, binary_matrix, n_queens) and sympy's ``parse_expr`` evaluates it in others, so
*all* scoring runs in the ``reasoning_gym`` sandbox profile: the warm pool's fork servers import
reasoning_gym and build every scorer once per box (``Profile.preload``), then fork per answer.

Scored 0 without running anything: no ``<answer>`` tag, an empty answer, an answer longer than the
row's limit (a scorer must not eval megabytes). The limit follows from the row's own data: the larger
of ``max_answer_chars`` and ``oracle_length_factor`` times its oracle answer (the ``answer`` column,
else the entry's). A fixed limit alone scored correct answers 0 where the data needs them long
(spiral_matrix and number_sorting at hard and expert: oracles of 5,000-19,000 chars), while an answer
beyond what its row needs is still degenerate output and scores 0. reasoning-gym's default scorer pays
len(oracle)/len(answer) when the oracle is a substring of the answer; only the last tag counts,
so a completion that hedges with many candidates earns at most that ratio (tested: < 0.05).

What the sandbox cannot stop: an answer that a scorer evaluates runs as Python in that one
scoring process, so it could print a forged score for itself. It cannot touch the host, other
answers or the next run (fresh fork, wiped box); the reward it can forge is its own. The score
line carries a per-run token read from stdin to keep plain output from being taken as a score.
params: max_answer_chars (4000), oracle_length_factor (2), timeout_s (15), memory_mb.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
import sysconfig
from typing import Any

from pydantic import PositiveFloat, PositiveInt

from infra.sandbox import shared_pool
from infra.sandbox.api import PROFILES, Limits, Profile, ro_mount
from temper.verifiers.base import Verdict, not_judged
from temper.verifiers.pooled import PooledVerifier

log = logging.getLogger(__name__)

#: The one place the host repeats reasoning_gym.utils.extract_answer's pattern: to skip the sandbox
#: when there is no tag at all (then extract_answer returns None and there is nothing to score).
_TAG = re.compile(r"<answer>\s?(.*?)\s?</answer>", re.DOTALL)

PRELOAD = """
import reasoning_gym
from reasoning_gym.factory import DATASETS, get_score_answer_fn
from reasoning_gym.utils import extract_answer
SCORERS = {}
for _task in DATASETS:
    try:
        SCORERS[_task] = get_score_answer_fn(_task)
    except Exception:  # built on first use in the run instead
        pass
"""

SCORER_FILE = "score.py"
SCORER = r"""
import json, sys
req = json.loads(sys.stdin.readline())
token = req.pop("token")
for p in req["paths"]:
    if p not in sys.path:
        sys.path.append(p)
pre = sys.modules.get("__temper_preload__")
if pre is None:  # cold run: the fork server was not available
    from reasoning_gym.factory import get_score_answer_fn
    from reasoning_gym.utils import extract_answer
    fn = get_score_answer_fn(req["task"])
else:
    extract_answer = pre.extract_answer
    fn = pre.SCORERS.get(req["task"]) or pre.get_score_answer_fn(req["task"])
answer = extract_answer(req["completion"])
out = sys.stdout
sys.stdout = sys.stderr  # what a scorer prints is not the result
try:
    score = fn(answer, req["entry"])
    line = "%s %r %s" % (token, float(score), json.dumps(answer[:200] if isinstance(answer, str) else answer))
except Exception as e:
    line = "%s error %s" % (token, json.dumps("%s: %s" % (type(e).__name__, e)))
out.write("\n" + line + "\n")
out.flush()
"""


def site_paths() -> tuple[str, ...]:
    """Where this interpreter's reasoning_gym lives (bound read-only into the sandbox)."""
    paths = sysconfig.get_paths()
    return tuple(dict.fromkeys(p for p in (paths["purelib"], paths["platlib"]) if p))


def profile() -> Profile:
    """The reasoning_gym sandbox profile: python isolation, the venv's site-packages read-only, preload.

    Box limits are roomy because the fork server pays the import (and its CPU counts against its
    own RLIMIT_CPU for its whole life); each run gets the verifier's tighter limits.
    """
    prof = PROFILES.get("reasoning_gym")
    if prof is None:
        py = PROFILES["python"]
        prof = PROFILES["reasoning_gym"] = Profile(
            name="reasoning_gym", limits=Limits(wall_s=60, cpu_s=600, memory_mb=3072, nproc=32),
            code_file=py.code_file, code_argv=py.code_argv, ro_paths=site_paths(), preload=PRELOAD)
    return prof


def extract(completion: str) -> str | None:
    matches = _TAG.findall(completion)
    return matches[-1].strip() if matches else None


class ReasoningGymVerifier(PooledVerifier):
    family = "reasoning_gym"
    known_params = {"max_answer_chars": PositiveInt, "oracle_length_factor": PositiveFloat, "timeout_s": PositiveInt,
                    "memory_mb": PositiveInt}
    sandbox_profile = "reasoning_gym"

    def _job(self, record: dict[str, Any], completion: str):
        try:
            entry = json.loads(record["entry"]) if isinstance(record.get("entry"), str) else record.get("entry")
        except ValueError:
            return not_judged("record's 'entry' is not JSON"), None
        if not isinstance(entry, dict) or not isinstance(entry.get("metadata"), dict):
            return not_judged("record has no 'entry' object with 'metadata'"), None
        task = record.get("task") or entry["metadata"].get("source_dataset")
        if not task:
            return not_judged("record names no task ('task' or entry.metadata.source_dataset)"), None
        answer = extract(completion or "")
        limit = self.answer_limit(record, entry)
        if answer is None or answer == "" or len(answer) > limit:
            why = "no <answer> tag" if answer is None else ("empty answer" if answer == "" else f"answer over {limit} chars")
            return Verdict(0.0, {"task": task, "reason": why, "format": True}), None  # the form, not the task

        pool = shared_pool(profile().name)
        token = secrets.token_hex(16)
        request = {"token": token, "task": task, "entry": entry, "completion": completion,
                   "paths": [ro_mount(p) for p in pool.profile.ro_paths]}
        limits = Limits(wall_s=float(self.params.get("timeout_s", 15)), cpu_s=int(self.params.get("timeout_s", 15)),
                        memory_mb=int(self.params.get("memory_mb", 2048)), nproc=8)
        kwargs = dict(files={SCORER_FILE: SCORER}, limits=limits, stdin=(json.dumps(request) + "\n").encode())
        return None, (pool, token, task, kwargs)

    def answer_limit(self, record: dict[str, Any], entry: dict[str, Any]) -> int:
        """Longest answer scored for this row: what its oracle needs (times a margin for other spellings of
        a correct answer), never less than ``max_answer_chars``."""
        oracle = record.get("answer")
        if oracle is None:
            oracle = entry.get("answer")
        floor = int(self.params.get("max_answer_chars", 4000))
        if oracle is None:
            return floor
        return max(floor, int(float(self.params.get("oracle_length_factor", 2)) * len(str(oracle))))

    @staticmethod
    def _verdict(result, context: tuple[str, str]) -> Verdict | None:
        token, task = context
        if result.verdict in ("error", "not_started"):
            log.warning("reasoning_gym: sandbox failed: %s", result.stderr[-300:])
            return not_judged(f"sandbox failed: {result.stderr.strip()[-200:]}")
        details = {"task": task, "verdict": result.verdict, "wall_s": result.wall_s}
        for line in reversed(result.stdout.splitlines()):
            if line.startswith(token + " "):
                _, value, rest = line.split(" ", 2)
                if value == "error":  # the scorer raised on this answer: reasoning-gym gives it nothing
                    return Verdict(0.0, {**details, "scorer_error": json.loads(rest)})
                score = float(value)
                return Verdict(min(1.0, max(0.0, score)), {**details, "answer": json.loads(rest)})
        # killed (timeout, memory) or exited before reporting, e.g. an evaluated answer called exit()
        return Verdict(0.0, {**details, "exit_code": result.exit_code, "stderr": result.stderr[-300:]})

    def _prepare(self, record: dict[str, Any], completion: str):
        early, job = self._job(record, completion)
        if job is None:
            return early, None
        pool, token, task, kwargs = job
        return None, (pool, ["python3", "-I", SCORER_FILE], kwargs, (token, task))
