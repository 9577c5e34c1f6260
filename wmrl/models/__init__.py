"""Policy and world-model transformers, sampler, sharding rules and train steps."""
