#!/usr/bin/env bash
# Runs python/inprocess_test.py (unittest) with the system Python (and its torch, if any).
exec /usr/bin/python3 "$(dirname "$0")/inprocess_test.py"
