"""Peers for the tests: scripts the tests run as subprocesses, and helpers they import.

This file makes ``peers`` a regular package, so that mypy (which crawls ``tests``) and the tests
(``from peers.sdk_remote_client import ...``, with ``tests`` on the path) name its modules alike.
"""
