"""Multi-turn GRPO through TRL's own ``rollout_func``: one GRPO sample = one whole episode.

``GRPOTrainer(rollout_func=...)`` hands this module each rank's prompts (already repeated
``num_generations`` times by TRL's sampler) and takes back, per sample, ``prompt_ids``,
``completion_ids`` and extra fields. The completion of a sample is its whole episode laid end to
end: model turn, observation, model turn, ... ``env_mask`` (TRL's name for it) is 1 on the
tokens the model sampled and 0 on the observation tokens the environment wrote; TRL multiplies
it into the loss mask (``completion_mask * tool_mask``), so observations get no gradient
(``tests/integration/test_multiturn_grpo.py`` checks the gradient). The episode's reward
(its environment's end-state check, ``EpisodeEnvironment.get_reward``) comes back as the extra
field ``episode_reward``, which ``episode_reward`` below hands to TRL as a reward function.

Why not ``environment_factory``: TRL requires a chat template that renders tool calls for it
(the tiny model's does not) and its tool loop enters ``unwrap_model_for_generation`` once per
tool round, a collective under ZeRO-3 whose count then differs between ranks whose episodes
differ in length. Here the weights are gathered *once* per rollout and every turn of every
episode is generated locally (``synced_gpus=False``), so ranks whose episodes take different
numbers of turns never wait on each other: the only collective is the fixed-size gather of the
episode statistics at the end, which every rank makes exactly once.

With ``grpo.generation: engine`` the turns are sampled by the embedded rollout engine instead
(``temper.training.engine_rollouts``: its own copy of the weights, synced after every optimizer
step), single-turn runs included: episodes whose contexts are identical (a group's first turn) go
as one request of ``n`` samples, and the sampled tokens' log-probabilities go back to TRL.

TRL passes ``rollout_func`` the prompts only, so the task of a prompt is looked up by its text
(``tasks``: prompt -> (domain, record), built from the run's materialised stream); two rows with
the same prompt text are the same task.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch

from infra.sandbox import SandboxPool
from temper.agent import trajectories
from temper.agent.environment import ENDINGS, FAILURE_OUTCOMES, EpisodeEnvironment, observation_block
from temper.agent.kinds import ENVIRONMENTS
from temper.data.domain import Domain
from temper.training.engine_rollouts import PolicyEngine
from temper.verifiers.registry import get_verifier

log = logging.getLogger(__name__)

EPISODE_FAMILY = "episode"
STAT_FIELDS = ("episodes", "turns", "done", "reward", "failed", "timeout", "wall_s")


def is_multiturn(domain: Domain) -> bool:
    return domain.verifier.family == EPISODE_FAMILY


def _prompt_key(prompt: Any) -> str:
    if isinstance(prompt, str):
        return prompt
    return "\x00".join(f"{m.get('role')}:{m.get('content')}" for m in prompt)


def episode_reward(prompts: list, completions: list, episode_reward: list | None = None, **_: Any) -> list:
    """TRL reward function: the reward each episode's environment gave its end state (None when the
    sample was not an episode, so other reward functions of a mixed run decide it)."""
    return list(episode_reward) if episode_reward is not None else [None] * len(prompts)


class OneTurn:
    """The stand-in environment of a single-turn sample in a mixed run: it ends after one model turn
    and leaves the reward to the domain's own verifier (``get_reward`` is None)."""

    outcome = "running"
    turns = 0
    trajectory: list = []

    @property
    def finished(self) -> bool:
        return self.outcome != "running"

    def step(self, text: str) -> str:
        self.outcome, self.turns = "done", 1
        return ""

    def get_reward(self) -> None:
        return None


def rollout_for(domains: Iterable[Domain], rows: Iterable[dict[str, Any]],
                generation: str = "trainer") -> "MultiTurnRollout | None":
    """The ``rollout_func`` of a GRPO run: None when TRL generates itself (no multi-step domain, and
    generation 'trainer' or 'vllm'), else one rollout for all of its samples (single-turn ones get
    one turn), sampled by the trainer's model or, with generation 'engine', the embedded engine."""
    domains = list(domains)
    multi = any(is_multiturn(d) for d in domains)
    if generation == "vllm" and multi:
        raise ValueError("grpo.generation 'vllm' supports single-turn domains only; multi-step domains "
                         f"({', '.join(d.name for d in domains if is_multiturn(d))}) need 'trainer' or 'engine'")
    if generation == "engine" or multi:
        return MultiTurnRollout(domains, rows, engine=generation == "engine")
    return None


class MultiTurnRollout:
    """The ``rollout_func`` of a GRPO run over multi-step domains.

    ``max_turn_tokens``: new tokens per model turn; the whole episode (turns and observations)
    stays within the trainer's ``max_completion_length``: an episode that would not fit another
    turn ends with outcome ``max_tokens`` (reward 0). ``engine``: sample through a ``PolicyEngine``
    (built at the first rollout, weights synced every step; ``engine_sync=False`` only for the test
    that shows parity needs the sync).
    """

    __name__ = "multiturn_rollout"

    def __init__(self, domains: Iterable[Domain], rows: Iterable[dict[str, Any]], max_turn_tokens: int = 64,
                 environment_kwargs: dict[str, Any] | None = None, engine: bool = False,
                 engine_sync: bool = True) -> None:
        domains = list(domains)
        self.domains = {d.name: d for d in domains if is_multiturn(d)}
        if not self.domains and not engine:
            raise ValueError("multi-turn rollout: no domain with verifier family 'episode'")
        self.use_engine, self.engine_sync = engine, engine_sync
        self.engine: PolicyEngine | None = None
        self._reuse_seen: dict[str, float] | None = None
        self.verifiers = {n: get_verifier(d.verifier.family, d.verifier.params) for n, d in self.domains.items()}
        self.names = sorted(self.domains)
        self.turn_tokens = {n: int(d.verifier.params.get("turn_tokens", max_turn_tokens))
                            for n, d in self.domains.items()}
        self.environment_kwargs = environment_kwargs or {}  # per domain, e.g. {"file_tasks": {"pool": p}}
        self.tasks: dict[str, tuple[str, dict[str, Any]]] = {}
        for row in rows:
            if row.get("domain") in self.domains:
                record = row["record"] if isinstance(row["record"], dict) else json.loads(row["record"])
                self.tasks[_prompt_key(row["prompt"])] = (row["domain"], record)
        self.last_episodes: list[dict[str, Any]] = []  # this rank's episodes of the latest rollout (tests, logs)
        self._pruned = False  # whether this process's first rollout has cut a killed attempt's lines

    # -- tokens ---------------------------------------------------------------------------------------
    def _prompt_ids(self, tokenizer, prompt: Any) -> list[int]:
        if isinstance(prompt, str):  # the way TRL tokenizes a plain prompt
            return list(tokenizer(text=[prompt])["input_ids"][0])
        out = tokenizer.apply_chat_template(conversation=[prompt], add_generation_prompt=True, tokenize=True,
                                            return_dict=True)
        return list(out["input_ids"][0])

    def _observation_ids(self, tokenizer, conversational: bool, observation: str) -> list[int]:
        """The observation as the next user message (chat prompts: the chat template's own rendering of
        it after an assistant turn, generation prompt included), or a plain-text block."""
        if conversational and tokenizer.chat_template:
            base = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
            before = tokenizer.apply_chat_template(base, tokenize=False)
            after = tokenizer.apply_chat_template(base + [{"role": "user", "content": observation}], tokenize=False,
                                                  add_generation_prompt=True)
            text = after[len(before):] if after.startswith(before) else f"\n{observation}\n"
        else:
            text = observation_block(observation)
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    # -- the rollout ------------------------------------------------------------------------------------
    def __call__(self, prompts: list, trainer) -> dict[str, Any]:
        # lazy: trl (200 ms) would load in fast unit tests (test_domain_roles.py imports training.run)
        from trl.models.utils import unwrap_model_for_generation

        if self.use_engine:
            if self.engine is None:
                self.engine = PolicyEngine(trainer, sync=self.engine_sync)
            self.engine.ensure_current()  # after every optimizer step: the rollout samples the current weights
        elif not trainer.args.ds3_gather_for_generation and trainer.accelerator.num_processes > 1:
            # without gathered weights every forward is a ZeRO-3 collective, and ranks whose episodes
            # take different numbers of turns would wait on each other forever
            raise ValueError("multi-turn rollouts need ds3_gather_for_generation=True when training on several ranks")
        tokenizer = trainer.processing_class
        tokenizer = getattr(tokenizer, "tokenizer", tokenizer)
        budget = trainer.max_completion_length
        eos = set(trainer.eos_token_ids) | {tokenizer.pad_token_id}
        conversational = not isinstance(prompts[0], str)
        episodes: list[dict[str, Any]] = []
        for prompt in prompts:
            key = _prompt_key(prompt)
            if key not in self.tasks:  # a single-turn domain's prompt in a mixed run: one turn, scored by its verifier
                ep = {"index": len(episodes), "domain": None, "env": OneTurn(), "cap": budget,
                      "prompt_ids": self._prompt_ids(tokenizer, prompt), "ids": [], "mask": [], "t0": time.monotonic()}
                episodes.append(ep)
                continue
            name, record = self.tasks[key]
            env = self._environment(name, prompts)
            ep = {"index": len(episodes), "domain": name, "env": env, "cap": self.turn_tokens[name], "record": record,
                  "prompt_ids": self._prompt_ids(tokenizer, prompt), "ids": [], "mask": [], "t0": time.monotonic()}
            episodes.append(ep)
        # every episode holds its own box for the whole rollout; starting and stepping them are blocking
        # sandbox calls, so they run side by side in threads
        self._each(self._reset, [ep for ep in episodes if ep["domain"] is not None])

        for ep in episodes:
            ep["logprobs"], ep["scored"] = [], True
        generator = nullcontext() if self.use_engine else unwrap_model_for_generation(
            trainer.model_wrapped, trainer.accelerator, gather_deepspeed3_params=trainer.args.ds3_gather_for_generation,
            generation_kwargs=trainer.generation_kwargs)
        with generator as model, torch.no_grad():
            while active := [ep for ep in episodes if not ep["env"].finished]:
                room = [budget - len(ep["ids"]) for ep in active]
                for ep, r in zip(active, room):
                    if r <= 0:
                        ep["env"].outcome = "max_tokens"
                active = [ep for ep, r in zip(active, room) if r > 0]
                if not active:
                    break
                # one generate call per turn-length cap (multi-step domains' turn_tokens; a single turn: all)
                caps = sorted({ep["cap"] for ep in active})
                groups = [[ep for ep in active if ep["cap"] == cap] for cap in caps]
                new = []
                for cap, group in zip(caps, groups):
                    new += self._generate(model, trainer, tokenizer, group,
                                          min(cap, *[budget - len(ep["ids"]) for ep in group]), eos)
                active = [ep for group in groups for ep in group]
                observations = self._each(lambda ep_turn: ep_turn[0]["env"].step(
                    tokenizer.decode(ep_turn[1], skip_special_tokens=True)), list(zip(active, new)))
                for ep, turn, observation in zip(active, new, observations):
                    logprobs = ep.pop("turn_logprobs", None)  # the engine's; None: sampled elsewhere
                    ep["scored"] = ep["scored"] and logprobs is not None
                    ep["ids"] += turn
                    ep["mask"] += [1] * len(turn)
                    ep["logprobs"] += logprobs if logprobs is not None else [0.0] * len(turn)
                    if ep["env"].finished:
                        continue
                    obs_ids = self._observation_ids(tokenizer, conversational, observation)
                    obs_ids = obs_ids[: max(0, budget - len(ep["ids"]) - 1)]
                    ep["ids"] += obs_ids
                    ep["mask"] += [0] * len(obs_ids)
                    ep["logprobs"] += [0.0] * len(obs_ids)  # not sampled; masked out of the loss

        rewards = self._each(lambda ep: ep["env"].get_reward(), episodes)  # end-state checks; boxes go back
        for ep, reward in zip(episodes, rewards):
            env = ep["env"]
            ep["reward"] = reward
            ep["outcome"], ep["turns"], ep["wall_s"] = env.outcome, env.turns, time.monotonic() - ep["t0"]
            if not ep["ids"]:  # an episode that never started: one pad token, masked out
                ep["ids"], ep["mask"], ep["logprobs"] = [tokenizer.pad_token_id], [0], [0.0]
        self._log(trainer, episodes)
        if self.use_engine:
            self._log_reuse(trainer)
        self._record(trainer, episodes)
        self.last_episodes = [{k: ep[k] for k in ("domain", "outcome", "turns", "reward", "wall_s", "mask")}
                              | {"trajectory": ep["env"].trajectory} for ep in episodes]
        return {"prompt_ids": [ep["prompt_ids"] for ep in episodes],
                "completion_ids": [ep["ids"] for ep in episodes],
                # the sampling distribution's log-probability of each token (0 on observations), when the
                # engine sampled every turn
                "logprobs": ([ep["logprobs"] for ep in episodes]
                             if self.use_engine and all(ep["scored"] for ep in episodes) else None),
                "env_mask": [ep["mask"] for ep in episodes],
                "episode_reward": [ep["reward"] for ep in episodes],
                "episode_turns": [ep["turns"] for ep in episodes],
                "episode_outcome": [ep["outcome"] for ep in episodes]}

    @staticmethod
    def _each(fn, items: list) -> list:
        if len(items) <= 1:
            return [fn(x) for x in items]
        with ThreadPoolExecutor(max_workers=min(16, len(items)), thread_name_prefix="episode") as pool:
            return list(pool.map(fn, items))

    @staticmethod
    def _reset(ep: dict[str, Any]) -> None:
        try:
            ep["env"].reset(**ep["record"])
        except Exception as e:  # no box in time, setup failed: this episode fails, the step goes on
            log.warning("multi-turn rollout: %s episode could not start: %s", ep["domain"], e)
            ep["env"].outcome = "sandbox_error"

    def _environment(self, name: str, prompts: list) -> EpisodeEnvironment:
        """A fresh environment for one episode of domain ``name`` (tests substitute scripted ones)."""
        return self.verifiers[name].environment(**self._environment_kwargs(name, prompts))

    def _environment_kwargs(self, name: str, prompts: list) -> dict[str, Any]:
        """A sandboxed domain's episodes share one warm pool with a box per concurrent episode of this
        rank (grown when a rollout holds more), unless the caller gave the domain its own kwargs."""
        if name in self.environment_kwargs:
            return self.environment_kwargs[name]
        if not ENVIRONMENTS[self.domains[name].verifier.params.get("env", "files")].holds_box:
            return {}
        need = len(prompts)
        pool = getattr(self, "_pool", None)
        if pool is None or pool._closed or pool.size + pool.spare < need:
            if pool is not None:
                pool.close()
            pool = self._pool = SandboxPool("shell", size=need, spare=0)
        return {"pool": pool}

    def _generate(self, model, trainer, tokenizer, active: list[dict[str, Any]], max_new: int,
                  eos: set[int]) -> list[list[int]]:
        """One model turn (token ids, ending at the first EOS) for each active episode, sampled locally
        (no collective: the weights are gathered, or the engine has its own). Tests override it with
        scripted turns."""
        if self.use_engine:
            return self._engine_generate(active, max_new)
        inputs = [ep["prompt_ids"] + ep["ids"] for ep in active]
        width = max(len(x) for x in inputs)
        pad = tokenizer.pad_token_id
        ids = torch.tensor([[pad] * (width - len(x)) + x for x in inputs], device=trainer.accelerator.device)
        attention = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in inputs],
                                 device=trainer.accelerator.device)
        out = model.generate(input_ids=ids, attention_mask=attention, generation_config=trainer.generation_config,
                             max_new_tokens=max_new, synced_gpus=False)
        turns = []
        for row in out[:, width:].tolist():
            turn = []
            for tok in row:
                turn.append(tok)
                if tok in eos:
                    break
            turns.append(turn)
        return turns

    def _engine_generate(self, active: list[dict[str, Any]], max_new: int) -> list[list[int]]:
        """The turn of each active episode from the engine: episodes with the same context so far (a
        GRPO group's first turn) share one request of n samples, so the prompt is prefilled once."""
        groups: dict[tuple[int, ...], list[dict[str, Any]]] = {}
        for ep in active:
            groups.setdefault(tuple(ep["prompt_ids"] + ep["ids"]), []).append(ep)
        samples = self.engine.sample([(list(ctx), len(eps), max_new) for ctx, eps in groups.items()])
        turns: dict[int, list[int]] = {}
        for eps, group in zip(groups.values(), samples):
            for ep, (ids, logprobs) in zip(eps, group):
                turns[id(ep)] = ids
                ep["turn_logprobs"] = logprobs
        return [turns[id(ep)] for ep in active]

    def _record(self, trainer, episodes: list[dict[str, Any]]) -> None:
        """Every episode of this rank's rollout as a trajectory line (``temper replay`` re-executes them)
        in ``<output_dir>/trajectories/rank<k>.jsonl``, written once the rollout's episodes have all ended
        (a kill during a rollout records none of its episodes). A resumed run first drops what a killed
        attempt wrote for the steps it redoes, so each step's episodes are in the file once."""
        path = Path(trainer.args.output_dir) / "trajectories" / f"rank{trainer.accelerator.process_index}.jsonl"
        if not self._pruned:  # the first rollout of this process: a resumed run redoes the steps after its checkpoint
            self._pruned = True
            if dropped := trajectories.drop_from_step(path, trainer.state.global_step):
                log.info("trajectories: dropped %d line(s) of steps >= %d that a killed attempt wrote", dropped,
                         trainer.state.global_step)
        lines = [trajectories.trajectory(self.domains[ep["domain"]].verifier.params.get("env", "files"),
                                         ep["env"].limits, ep["record"], ep["env"], ep["reward"], ep["domain"],
                                         step=trainer.state.global_step, rank=trainer.accelerator.process_index)
                 for ep in episodes if ep["domain"] is not None and isinstance(ep["env"], EpisodeEnvironment)]
        if lines:
            trajectories.write(path, lines)

    # -- metrics ------------------------------------------------------------------------------------------
    def _log_reuse(self, trainer) -> None:
        """The engine's prompt reuse in this rollout, summed over ranks (a collective: every rank with
        generation 'engine' calls it once per rollout): prompt tokens of every sample, those reused
        (prefix-cache hits + a group's shared rows, ``Engine.prompt_reuse``), and their ratio."""
        now = self.engine.engine.prompt_reuse()
        last = self._reuse_seen or {"prompt_tokens": 0, "reused_tokens": 0}
        self._reuse_seen = now
        part = torch.tensor([now["prompt_tokens"] - last["prompt_tokens"], now["reused_tokens"] - last["reused_tokens"]],
                            dtype=torch.float64)
        prompt, reused = trainer.accelerator.reduce(part.to(trainer.accelerator.device), reduction="sum").cpu().tolist()
        metrics = trainer._metrics["train" if trainer.model.training else "eval"]
        metrics["engine/prompt_tokens"].append(prompt)
        metrics["engine/reused_prompt_tokens"].append(reused)
        if prompt:
            metrics["engine/prompt_hit_rate"].append(reused / prompt)

    def _log(self, trainer, episodes: list[dict[str, Any]]) -> None:
        """Per-domain episode statistics summed over ranks (one fixed-size gather per rollout, same on
        every rank) into TRL's metrics: turns per episode, done/failed shares, timeouts, reward, wall time, and
        the count of each ending (``episodes/<domain>/ended/<outcome>``)."""
        if not self.names:  # a single-turn run through the engine: no episode statistics (same on every rank)
            return
        stats = torch.zeros(len(self.names), len(STAT_FIELDS) + len(ENDINGS), dtype=torch.float64)
        for ep in episodes:
            if ep["domain"] is None:
                continue
            row = stats[self.names.index(ep["domain"])]
            row += torch.tensor([1, ep["turns"], ep["outcome"] == "done", ep["reward"],
                                 ep["outcome"] in FAILURE_OUTCOMES,
                                 ep["outcome"] in ("timeout", "budget"), ep["wall_s"]]
                                + [ep["outcome"] == e for e in ENDINGS], dtype=torch.float64)
        total = trainer.accelerator.reduce(stats.to(trainer.accelerator.device), reduction="sum").cpu()
        mode = "train" if trainer.model.training else "eval"
        for i, name in enumerate(self.names):
            n = float(total[i, 0])
            if n == 0:
                continue
            values = dict(zip(STAT_FIELDS + tuple(f"n_{e}" for e in ENDINGS), total[i].tolist()))
            metrics = trainer._metrics[mode]
            metrics[f"episodes/{name}/turns_per_episode"].append(values["turns"] / n)
            metrics[f"episodes/{name}/done_rate"].append(values["done"] / n)
            metrics[f"episodes/{name}/failure_rate"].append(values["failed"] / n)
            metrics[f"episodes/{name}/timeouts"].append(values["timeout"])
            metrics[f"episodes/{name}/reward"].append(values["reward"] / n)
            metrics[f"episodes/{name}/wall_s"].append(values["wall_s"] / n)
            for ending in ENDINGS:  # how many episodes ended each way (no_action, timeout = hung, sandbox_error ...)
                metrics[f"episodes/{name}/ended/{ending}"].append(values[f"n_{ending}"])
