from __future__ import annotations

# Outbound rate-limit observations live beside their Redis hot store.
from ratelimit.observations import RateLimitObservation  # noqa: F401 (registers the model)
