from django.apps import AppConfig


class RatelimitConfig(AppConfig):
    name = "ratelimit"
    verbose_name = "Outbound rate limits"

    def ready(self):
        # A job waiting on a bucket wakes only once admission would let it call out.
        from jobs import delayed, retention
        from ratelimit.admission import admit
        from ratelimit.observations import RETENTION

        delayed.set_wake_check(lambda key, resource: admit(key, resource).until)
        # Observations are history past their horizon (jobs.retention).
        retention.register(RETENTION)
