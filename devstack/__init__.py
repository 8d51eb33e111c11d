"""The embedded development stack: `make run` / `make demo` (manage.py runstack) and the demo site.

Not part of the service a deployment runs: docker-compose.yml starts the same processes itself.
"""
