// Bazel compiles this linkstamp into every binary that links //common:version, with the
// build-info header included: the redacted one (BUILD_SCM_REVISION "0", BUILD_TIMESTAMP 0)
// in a plain build, the real one with --stamp. It depends on nothing else.
#ifndef BUILD_SCM_REVISION
#define BUILD_SCM_REVISION ""
#endif
#ifndef BUILD_SCM_STATUS
#define BUILD_SCM_STATUS ""
#endif
#ifndef BUILD_TIMESTAMP
#define BUILD_TIMESTAMP 0
#endif

extern const char kRingmasterBuildRevision[] = BUILD_SCM_REVISION;
extern const char kRingmasterBuildStatus[] = BUILD_SCM_STATUS;
extern const long long kRingmasterBuildTimestamp = BUILD_TIMESTAMP;
