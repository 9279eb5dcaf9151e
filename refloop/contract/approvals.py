"""What tasks and the operator's settings agree on about a person's approval (light: the
settings import it at start-up)."""

from __future__ import annotations

# A call waits this long for a person's decision by default (a task left overnight is
# answered in the morning); unanswered, the task ends incomplete, naming the call.
APPROVAL_TIMEOUT_S = 3 * 24 * 3600.0
