# Flower reads this file (its --conf, default ./flowerconfig.py) before it builds its app:
# config.flower puts its login in front of /metrics and throttles failed logins.
import config.flower  # noqa: F401
