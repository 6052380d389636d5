"""Watch windows in the store: kept per deployment, older ones deleted on write (the retention setting)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from store import Store


def test_windows_are_kept_and_old_ones_deleted_on_write(store: Store) -> None:
    now = datetime.now(UTC)
    store.save_watch_window("llama", now - timedelta(days=10), 15.0, "paying", {"mean_acceptance_length": 2.5}, None)
    store.save_watch_window("other", now - timedelta(days=3), 15.0, "source down", {"message": "refused"}, None)
    assert [w["verdict"] for w in store.list_watch_windows("llama")] == ["paying"]
    store.save_watch_window("llama", now, 15.0, "costing you", {"predicted_speedup": 0.8}, retention_days=7)
    kept = store.list_watch_windows("llama")
    assert [w["verdict"] for w in kept] == ["costing you"] and kept[0]["figures"] == {"predicted_speedup": 0.8}
    assert store.watch_deployments() == ["llama", "other"]  # 3 days old: within 7
    store.save_watch_window("llama", now + timedelta(seconds=15), 15.0, "paying", {}, retention_days=7)
    assert [w["verdict"] for w in store.list_watch_windows("llama", limit=1)] == ["paying"]
