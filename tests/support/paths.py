"""Where the tests find the repository and the shared real-device data."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Real device recordings beside the checkout (../shared/data); absent on a user's clone.
SHARED_DATA = ROOT.parent / "shared" / "data"
