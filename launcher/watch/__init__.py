"""Watching a run: heartbeats, stalls, stragglers, the live view, the dry-run display, each message once, the reports."""
