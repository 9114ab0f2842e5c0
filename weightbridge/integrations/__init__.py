"""Integrations with rollout engines and trainers. Each lives behind an extra and imports lazily."""
