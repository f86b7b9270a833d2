"""Elastic runs: which nodes run the next attempt, and restarts of the whole gang."""
