"""What the tree builders' fork server loads before it forks any (audits.treebuild).

Django set up and the analysis imported once, in the fork server, so that every child
forked from it starts ready: setting Django up in each child cost 0.8 s of CPU and
107 MB of its own. The server leaves the worker's session first, and its children with it.
"""

import contextlib
import os

import django

# A session of their own: a supervisor that stops the worker by signalling its process group
# (`make run`'s, systemd's) must not end a page mid-build; the worker's TreeBuilders
# bootstep stops them once its pool has finished its audits, and if the worker dies they
# end with its pipes. (Not a group leader, so setsid succeeds; the guard is for a server
# started some other way.)
with contextlib.suppress(OSError):
    os.setsid()

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django.setup()

import audits.analysis  # noqa: E402, F401  (the children's work, imported before they fork)
