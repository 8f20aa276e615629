#!/usr/bin/env bash
# Unpacks the release bundle and checks it, its systemd units and its Kubernetes manifests
# (deploy_test.py says what is checked).
set -euo pipefail
here="$TEST_SRCDIR/ringmaster/deploy"
exec /usr/bin/python3 "$here/deploy_test.py" "$here/ringmaster-bundle.tar.gz" \
  "$here/testing/fake_driver"
