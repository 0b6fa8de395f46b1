"""Multi-step agent episodes in the sandbox, recorded as trajectories and replayed."""
