"""The one way Plumb calls out: page fetches, link checks, GitHub, webhook deliveries.

    client.py        the client factory (SSRF guard, TLS, timeouts, user agent) and the
                     admission-aware sender (admission, observations, metrics, inline waits)
    bounded.py       every exchange bounded: one deadline over connect, headers and body,
                     and the body decoded from its raw bytes within a cap
    guard.py         the connect-time guard against private addresses
    urls.py          URL normalization: one spelling per page
    redirects.py     the one redirect loop
    statuses.py      the one HTTP-status classification
    hostslots.py     the one per-host (or per-credential) slot limiter, on Redis's clock
    integrations/    one module per downstream: page, links, github, webhook

Every integration raises only `jobs.errors` (Transient, RateLimited, Permanent).
"""
