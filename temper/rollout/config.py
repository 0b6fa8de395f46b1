"""Typed configuration of the rollout engine, its lanes and the fast profile.

``EngineConfig`` is what the embedded engine does (lanes, prefix-cache budget, chunk sizes);
where rollouts go (the embedded engine or a vLLM server at ``base_url``) is the platform's
settings, ``temper.core.settings.RolloutSettings``, and ``engine_config`` turns those into an
``EngineConfig``. Pydantic, so a bad value fails at load time with the field's name, not in the
middle of a GRPO step.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

if TYPE_CHECKING:  # a type only: pydantic_settings (130 ms) would load in fast unit tests (test_rollout_scheduler.py)
    from temper.core.settings import RolloutSettings

MIB = 1024 * 1024


class LaneConfig(BaseModel):
    """One request lane. A request goes to the first lane whose ``max_prompt_tokens`` it fits."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="Lane name; appears in 413/429 error bodies and the step log.")
    max_prompt_tokens: int = Field(gt=0, description="Longest prompt (tokens) this lane accepts.")
    max_queued: int = Field(default=64, ge=1, description="Requests waiting in this lane before 429.")
    max_running: int = Field(default=8, ge=1, description="Requests of this lane in prefill/decode at once.")
    prefill_chunk_tokens: int = Field(
        default=256, ge=1,
        description="Prompt tokens this lane prefills per scheduler step (chunked prefill budget).")
    time_share: float = Field(
        default=1.0, gt=0, le=1,
        description="Per-request forwards only (mixed_batches off, the fast profile, unsupported models): the "
                    "largest fraction of the engine's compute time this lane may take while another lane also "
                    "has work; 1.0 = unlimited (the latency-critical lane). Mixed batches bound a lane by "
                    "prefill_chunk_tokens per forward instead.")
    own_process: bool = Field(
        default=False,
        description="Serve this lane by an engine of its own in a separate process (its own CPU core, copy of the "
                    "weights from model_dir and prefix cache): its prefills and decodes then never lengthen another "
                    "lane's forwards. Only for engines that load model_dir themselves (not a live policy) with at "
                    "least 2 usable CPUs; ignored otherwise.")


def default_lanes() -> list[LaneConfig]:
    return [
        LaneConfig(name="short", max_prompt_tokens=2048, max_queued=256, max_running=16, prefill_chunk_tokens=512),
        LaneConfig(name="long", max_prompt_tokens=1 << 20, max_queued=16, max_running=2, prefill_chunk_tokens=256,
                   time_share=0.1, own_process=True),
    ]


class PrefixCacheConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    budget_bytes: int | None = Field(
        default=None, ge=0,
        description="Most bytes of K/V the prefix cache keeps. None: 256 MiB on CPU; on a GPU a quarter of the device "
                    "memory free once the weights are loaded (temper.rollout.device.prefix_budget).")
    cache_completions: bool = Field(
        default=True, description="Also keep prompt+completion KV so the next turn of an episode is not re-encoded.")


class SpeculativeConfig(BaseModel):
    """The fast profile: speculative decoding in the engine's own decode loop, its drafts from prompt lookup
    (``lookup.py``, no second model) or from a small draft model (``draft_model.py``)."""

    model_config = ConfigDict(extra="forbid")

    method: Literal["prompt_lookup", "draft_model"] = Field(
        default="prompt_lookup",
        description="prompt_lookup: drafts are n-gram matches in the prompt and the text so far, verified on the "
                    "engine's KV cache (prefix cache, chunked prefill and lanes as standard); draft_model: "
                    "drafts decoded greedily by draft_dir's model or an int8 copy of the target, on the same loop.")
    draft_dir: Path | None = Field(
        default=None, description="draft_model: HF folder of the draft model (same tokenizer as the target); None "
                                  "with quantize_draft means an int8 copy of the target.")
    quantize_draft: bool = Field(default=False, description="int8 dynamic-quantize the draft's Linear layers (CPU).")
    num_assistant_tokens: int = Field(default=5, ge=1, description="Draft tokens proposed per verification "
                                      "until the engine has measured what a verified position costs; then from that "
                                      "cost and the request's acceptance (draft_cost.py).")
    max_draft_tokens: int = Field(default=16, ge=1, description="Most draft tokens one step proposes.")
    max_ngram: int = Field(default=3, ge=1, le=8, description="prompt_lookup: longest suffix n-gram looked up.")
    verify: bool = Field(
        default=True,
        description="draft_model: verify draft tokens with the target (lossless). False serves the draft's own "
                    "tokens, a lossy path that exists so the parity gate is exercised against a real diverging variant.")

    @model_validator(mode="after")
    def _check(self) -> SpeculativeConfig:
        if self.method == "draft_model" and self.draft_dir is None and not self.quantize_draft:
            raise ValueError("speculative method draft_model needs draft_dir, or quantize_draft for an int8 copy of "
                             "the target")
        if self.method == "prompt_lookup" and (self.draft_dir is not None or self.quantize_draft or not self.verify):
            raise ValueError("speculative method prompt_lookup takes no draft_dir, quantize_draft or verify: false "
                             "(set method: draft_model for a draft model)")
        return self


class EngineConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model_dir: Path = Field(description="HF folder of the target model and its tokenizer.")
    served_model_name: str = Field(default="temper", description="The `model` name clients send.")
    profile: Literal["standard", "fast"] = "standard"
    speculative: SpeculativeConfig | None = Field(
        default=None, description="Profile 'fast': how it drafts; None there means prompt lookup.")
    lanes: list[LaneConfig] = Field(default_factory=default_lanes, min_length=1)
    prefix_cache: PrefixCacheConfig = Field(default_factory=PrefixCacheConfig)
    max_context_tokens: int | None = Field(
        default=None, description="Prompt + completion limit; None means the model's max_position_embeddings.")
    torch_threads: int | None = Field(
        default=None, description="Set torch's intra-op threads (process-wide!) when the engine starts; None = leave.")
    dtype: Literal["float32", "bfloat16"] = "float32"
    device: str = Field(
        default="auto", pattern=r"^(auto|cpu|cuda(:\d+)?)$",
        description="Where weights, KV cache and every tensor of a step live: 'auto' = the first CUDA device when "
                    "there is one, else the CPU; or 'cpu', 'cuda', 'cuda:N'. An engine handed a model uses the "
                    "model's device.")
    mixed_batches: bool = Field(
        default=True,
        description="One forward per scheduler step over every running request (decode rows first, then prefill "
                    "chunks up to forward_token_budget); False: one forward per request and lane time shares. "
                    "Llama/Mistral/Qwen2-style models mix (temper/rollout/mixed.py), in the standard profile and "
                    "the prompt-lookup fast profile (a request's verify is its segment of the forward).")
    forward_token_budget: int = Field(
        default=256, ge=1,
        description="Mixed batches: most new tokens in one forward. Decode rows always run (never wait); "
                    "prefill chunks fill what is left, lane by lane, each lane at most its prefill_chunk_tokens.")
    slot_decode: Literal["auto", "on", "off"] = Field(
        default="auto",
        description="Mixed batches: decode steps as one static forward over a pool of KV slots, replayed as CUDA "
                    "graphs (temper/rollout/slots.py). 'auto': on for engines on a GPU; 'on' on CPU runs the same "
                    "forward eagerly (how tests check it); 'off': the mixed forward decodes too.")
    decode_slots: int = Field(default=64, ge=1, description="Slot decode: rows (samples) the KV slot pool holds; "
                              "requests that find no free slots decode on the mixed path.")
    decode_slot_tokens: int = Field(default=2048, ge=64, description="Slot decode: positions per slot; a request "
                                    "whose prompt + max_tokens is longer decodes on the mixed path.")
    lane_process_threads: int = Field(
        default=1, ge=1,
        description="torch threads of each lane process (lanes with own_process). With torch_threads, "
                    "keep the two at most the machine's CPUs (on 2 cores: 1 and 1), or they take turns on a core.")
    step_log_size: int = Field(default=10_000, ge=0, description="Scheduler steps kept in the in-memory step log.")

    @model_validator(mode="after")
    def _check(self) -> EngineConfig:
        if self.profile == "fast" and self.speculative is None:
            self.speculative = SpeculativeConfig()  # prompt lookup: needs no draft
        names = [lane.name for lane in self.lanes]
        if len(set(names)) != len(names):
            raise ValueError(f"lane names must be unique, got {names}")
        limits = [lane.max_prompt_tokens for lane in self.lanes]
        if limits != sorted(limits):
            raise ValueError("lanes must be ordered by max_prompt_tokens (shortest first)")
        return self


def engine_config(rollout: RolloutSettings, **overrides) -> EngineConfig:
    """The embedded engine a rollout setting (``Settings.rollout``) asks for."""
    if rollout.model_dir is None:
        raise ValueError("engine_config needs model_dir")
    spec = None
    if rollout.profile == "fast":
        spec = SpeculativeConfig(method="draft_model", draft_dir=rollout.draft_dir) if rollout.draft_dir \
            else SpeculativeConfig()
    return EngineConfig(model_dir=rollout.model_dir, served_model_name=rollout.model, profile=rollout.profile,
                        speculative=spec, **overrides)
