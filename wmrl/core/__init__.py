"""The WMRL correction core: anchor routing, Online Debiasing, Inverse-Variance Denoising,
and the GRPO maths. Pure functions over explicit pytree state; every state is jittable and
checkpointable with Orbax."""
