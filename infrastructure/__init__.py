"""Agent-side infrastructure: world model, replay buffer, training re-exports."""
