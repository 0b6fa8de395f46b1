"""Rollouts for eval, GRPO and agents: an embedded transformers engine or a vLLM server, one client.

``config`` (typed settings: lanes, prefix-cache budget, fast profile, backend), ``kv_cache`` (radix
prefix KV cache with a byte budget and LRU), ``scheduler`` (lanes, admission, time shares),
``decoding`` (sampling, stop handling), ``engine`` (the scheduler loop: chunked prefill, batched
group decode), ``lookup`` + ``draft_model`` (the fast profile: speculative decoding in the engine's
decode loop, drafts from n-gram lookup or a small model),
``parity`` (the fast profile's gate and MLflow registration), ``protocol`` + ``server`` (the
OpenAI-compatible HTTP API), ``client`` (the one client for both backends). Heavy imports (torch,
transformers, fastapi, openai) happen in the modules that need them, not here.
"""
