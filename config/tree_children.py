"""What the tree builders' fork server loads before it forks any (audits.treebuild).

Django set up and the analysis imported once, in the fork server, so that every child
forked from it starts ready: setting Django up in each child cost 0.8 s of CPU and
107 MB of its own.
"""

import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django.setup()

import audits.analysis  # noqa: E402, F401  (the children's work, imported before they fork)
