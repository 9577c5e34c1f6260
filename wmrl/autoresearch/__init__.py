"""World Model RL on Mini AutoResearch: data stage, warm start, WM pretraining, the RL loop."""
