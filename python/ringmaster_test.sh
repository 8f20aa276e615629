#!/usr/bin/env bash
# Runs python/ringmaster_test.py (unittest) with the system Python.
exec /usr/bin/python3 "$(dirname "$0")/ringmaster_test.py"
