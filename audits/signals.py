"""What `audits` tells the apps above it, so it never imports them."""

from django.dispatch import Signal

# An audit reached succeeded or failed, and that is committed. Sent once per audit
# (the finish is a conditional update), with `audit_id`, `callback` (it has a callback
# URL) and `changed` (it found changes). The webhooks app listens.
audit_finished = Signal()
