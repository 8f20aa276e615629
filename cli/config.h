// Where ringctl finds its coordinator and credentials, like kubectl's kubeconfig or Ray's
// RAY_ADDRESS. Each setting is taken, in this order of precedence, from
//   1. its flag:         --coordinator, --token_file, --tls_ca, --tls_client_cert,
//                        --tls_client_key
//   2. the environment:  RINGMASTER_ADDRESS, RINGMASTER_TOKEN_FILE, RINGMASTER_TLS_CA,
//                        RINGMASTER_TLS_CLIENT_CERT, RINGMASTER_TLS_CLIENT_KEY
//   3. the config file:  --config FILE, else $RINGMASTER_CONFIG, else
//                        $XDG_CONFIG_HOME/ringmaster/config.yaml (XDG_CONFIG_HOME defaults
//                        to $HOME/.config) when it exists; a YAML mapping with the keys
//                        coordinator, token_file, tls_ca, tls_client_cert, tls_client_key
//                        (relative paths are relative to the file's directory)
//   4. the default:      coordinator 127.0.0.1:7070, no token, plaintext.
// Each setting remembers where it came from, so that an unreadable token file is reported
// with the flag, variable or config key that named it.
//
// Nothing here reads the process environment: the caller passes it in (ringctl_main.cc).
// Thread-safety: the functions are pure apart from reading files.
#ifndef RINGMASTER_CLI_CONFIG_H_
#define RINGMASTER_CLI_CONFIG_H_

#include <array>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "client/grpc_coordinator_client.h"

namespace ringmaster::cli {

inline constexpr char kDefaultCoordinator[] = "127.0.0.1:7070";

// The environment variables ResolveConnection reads (besides HOME and XDG_CONFIG_HOME).
inline constexpr std::array<const char*, 6> kConnectionEnvironment = {
    "RINGMASTER_ADDRESS",         "RINGMASTER_TOKEN_FILE",      "RINGMASTER_TLS_CA",
    "RINGMASTER_TLS_CLIENT_CERT", "RINGMASTER_TLS_CLIENT_KEY", "RINGMASTER_CONFIG",
};

// Variable name → value; a variable that is not set is absent (an empty value counts as
// not set).
using Environment = absl::flat_hash_map<std::string, std::string>;

// The connection flags as given on the command line; empty: not given.
struct ConnectionFlags {
  std::string coordinator;
  std::string token_file;
  std::string tls_ca;
  std::string tls_client_cert;
  std::string tls_client_key;
  std::string config;  // --config: the config file
};

// One resolved setting and where it came from: "--token_file", "$RINGMASTER_TOKEN_FILE",
// "/home/u/.config/ringmaster/config.yaml: token_file" or "default". An empty value means
// "none" (no token, no TLS).
struct Setting {
  std::string value;
  std::string source;
};

struct ConnectionSettings {
  Setting coordinator;
  Setting token_file;
  Setting tls_ca;
  Setting tls_client_cert;
  Setting tls_client_key;
};

// The contents of a config file; empty members were not in it. Paths are as written.
struct ConfigFile {
  std::string path;
  std::string coordinator;
  std::string token_file;
  std::string tls_ca;
  std::string tls_client_cert;
  std::string tls_client_key;
};

// Parses a config file's text. `path` names the file in errors.
// Errors: INVALID_ARGUMENT "<path>:<line>:<column>: ..." for YAML that does not parse, a
// root that is not a mapping, an unknown key (listing the known ones), a duplicate key or
// a value that is not a string.
absl::StatusOr<ConfigFile> ParseConfigFile(const std::string& path, const std::string& text);

// Applies the precedence above. Reads the config file (not the token or TLS files).
// Errors: INVALID_ARGUMENT for a config file given by --config or $RINGMASTER_CONFIG that
// cannot be read, or one that does not parse (ParseConfigFile); the default config file
// is read only when it exists.
absl::StatusOr<ConnectionSettings> ResolveConnection(const ConnectionFlags& flags,
                                                     const Environment& env);

// The client options of `settings`: reads the token (surrounding whitespace removed) and
// the TLS files.
// Errors: INVALID_ARGUMENT naming the setting's source and path when a file cannot be
// read or a token file is empty.
absl::StatusOr<client::CoordinatorClientOptions> ClientOptions(
    const ConnectionSettings& settings);

}  // namespace ringmaster::cli

#endif  // RINGMASTER_CLI_CONFIG_H_
