#!/usr/bin/env bash
# Bazel's --workspace_status_command for stamped builds (bazel build --config=stamp): the
# commit and whether the tree had changes, which --version prints (common/version.h).
# Prints nothing when this is not a git checkout (the version line says "build unknown").
commit="$(git rev-parse --short=12 HEAD 2>/dev/null)" || exit 0
echo "BUILD_SCM_REVISION $commit"
if [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then
  echo "BUILD_SCM_STATUS modified"
else
  echo "BUILD_SCM_STATUS clean"
fi
