"""Training workloads: SFT and multi-domain GRPO with TRL on DeepSpeed ZeRO-3.

``config`` is the one typed config (YAML on disk; its stage settings are also the
post_training flow's form); ``progress`` is what a person sees of a run; ``deepspeed`` generates the DeepSpeed
JSON and accelerate config from it; ``mixing`` is the seeded domain sampler whose state is
checkpointed; ``rewards`` routes each sample to its own domain's verifier; ``run`` builds
the TRL trainers; ``checkpoint`` syncs checkpoints with the store; ``export`` consolidates
ZeRO-3 partitions and registers the model in MLflow; ``tiny`` makes a test-size model.
"""
