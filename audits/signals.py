"""What `audits` tells the apps above it, so it never imports them."""

from django.dispatch import Signal

# An audit reached succeeded or failed. Sent once per audit (the finish is a conditional
# update), inside the finish's transaction, with `audit_id`, `callback` (it has a callback
# URL), `changed` (it found changes) and `page_callback` (its page has a callback URL;
# False for a failure, which owes the page nothing): a listener writes what it owes in
# that transaction (an outbox row) and publishes it with `transaction.on_commit`. The
# webhooks app listens.
audit_finished = Signal()
