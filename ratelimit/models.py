# Outbound rate-limit observations live beside their Redis hot store.
from ratelimit.observations import RateLimitObservation

__all__ = ["RateLimitObservation"]
