"""What the store's modules share."""

from __future__ import annotations

# Conditional UPDATEs touch rows the session has not loaded; skipping the ORM's session
# synchronisation saves a large share of each call on the worker's hot path.
NO_SYNC = {"synchronize_session": False}
