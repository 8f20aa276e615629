#include "cli/config.h"

#include <sys/stat.h>

#include <string>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/file_util.h"
#include "yaml-cpp/yaml.h"

namespace ringmaster::cli {
namespace {

// A config key, its flag, its variable and where ConfigFile and ConnectionSettings keep it.
struct Key {
  const char* name;
  const char* flag;
  const char* variable;
  std::string ConfigFile::*file;
  std::string ConnectionFlags::*given;
  Setting ConnectionSettings::*setting;
  bool is_path;
};

constexpr Key kKeys[] = {
    {"coordinator", "--coordinator", "RINGMASTER_ADDRESS", &ConfigFile::coordinator,
     &ConnectionFlags::coordinator, &ConnectionSettings::coordinator, false},
    {"token_file", "--token_file", "RINGMASTER_TOKEN_FILE", &ConfigFile::token_file,
     &ConnectionFlags::token_file, &ConnectionSettings::token_file, true},
    {"tls_ca", "--tls_ca", "RINGMASTER_TLS_CA", &ConfigFile::tls_ca, &ConnectionFlags::tls_ca,
     &ConnectionSettings::tls_ca, true},
    {"tls_client_cert", "--tls_client_cert", "RINGMASTER_TLS_CLIENT_CERT",
     &ConfigFile::tls_client_cert, &ConnectionFlags::tls_client_cert,
     &ConnectionSettings::tls_client_cert, true},
    {"tls_client_key", "--tls_client_key", "RINGMASTER_TLS_CLIENT_KEY",
     &ConfigFile::tls_client_key, &ConnectionFlags::tls_client_key,
     &ConnectionSettings::tls_client_key, true},
};

std::string Where(const std::string& path, const YAML::Mark& mark) {
  return absl::StrCat(path, ":", mark.line + 1, ":", mark.column + 1);
}

std::string KnownKeys() {
  std::vector<std::string> names;
  for (const Key& k : kKeys) names.push_back(k.name);
  return absl::StrJoin(names, ", ");
}

std::string Lookup(const Environment& env, const std::string& name) {
  auto it = env.find(name);
  return it == env.end() ? "" : it->second;
}

bool Exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

// `path` relative to the directory of `config`, unless absolute.
std::string RelativeTo(const std::string& config, const std::string& path) {
  if (path.empty() || path[0] == '/') return path;
  const size_t slash = config.find_last_of('/');
  return slash == std::string::npos ? path : absl::StrCat(config.substr(0, slash + 1), path);
}

}  // namespace

absl::StatusOr<ConfigFile> ParseConfigFile(const std::string& path, const std::string& text) {
  ConfigFile config;
  config.path = path;
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(path, e.mark), ": not valid YAML: ", e.msg));
  }
  if (root.IsNull()) return config;  // an empty file
  if (!root.IsMap()) {
    return absl::InvalidArgumentError(absl::StrCat(
        Where(path, root.Mark()), ": expected a mapping of the keys ", KnownKeys()));
  }
  absl::flat_hash_set<std::string> seen;
  for (const auto& entry : root) {
    const std::string name = entry.first.IsScalar() ? entry.first.Scalar() : "";
    const Key* key = nullptr;
    for (const Key& k : kKeys) {
      if (name == k.name) key = &k;
    }
    if (key == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(Where(path, entry.first.Mark()),
                                                     ": unknown key \"", name,
                                                     "\" (the keys are ", KnownKeys(), ")"));
    }
    if (!seen.insert(name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(Where(path, entry.first.Mark()), ": ", name, ": given twice"));
    }
    if (!entry.second.IsScalar()) {
      return absl::InvalidArgumentError(absl::StrCat(Where(path, entry.second.Mark()), ": ",
                                                     name, ": expected a string"));
    }
    config.*(key->file) = std::string(absl::StripAsciiWhitespace(entry.second.Scalar()));
  }
  return config;
}

absl::StatusOr<ConnectionSettings> ResolveConnection(const ConnectionFlags& flags,
                                                     const Environment& env) {
  // The config file: named (it must be there), or the default one (if it is there).
  std::string config_path = flags.config;
  std::string config_named_by = "--config";
  if (config_path.empty() && !Lookup(env, "RINGMASTER_CONFIG").empty()) {
    config_path = Lookup(env, "RINGMASTER_CONFIG");
    config_named_by = "$RINGMASTER_CONFIG";
  }
  ConfigFile config;
  if (config_path.empty()) {
    std::string base = Lookup(env, "XDG_CONFIG_HOME");
    if (base.empty() && !Lookup(env, "HOME").empty()) base = Lookup(env, "HOME") + "/.config";
    if (!base.empty() && Exists(base + "/ringmaster/config.yaml")) {
      config_path = base + "/ringmaster/config.yaml";
      config_named_by.clear();
    }
  }
  if (!config_path.empty()) {
    auto text = ReadFile(config_path);
    if (!text.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the config file", config_named_by.empty() ? "" : absl::StrCat(" (", config_named_by, ")"),
          ": ", text.status().message()));
    }
    auto parsed = ParseConfigFile(config_path, *text);
    if (!parsed.ok()) return parsed.status();
    config = *std::move(parsed);
  }

  ConnectionSettings settings;
  for (const Key& k : kKeys) {
    Setting& s = settings.*(k.setting);
    if (const std::string& given = flags.*(k.given); !given.empty()) {
      s = {given, k.flag};
    } else if (const std::string value = Lookup(env, k.variable); !value.empty()) {
      s = {value, absl::StrCat("$", k.variable)};
    } else if (const std::string& in_file = config.*(k.file); !in_file.empty()) {
      s = {k.is_path ? RelativeTo(config_path, in_file) : in_file,
           absl::StrCat(config_path, ": ", k.name)};
    } else {
      s = {"", "default"};
    }
  }
  if (settings.coordinator.value.empty()) settings.coordinator.value = kDefaultCoordinator;
  return settings;
}

absl::StatusOr<client::CoordinatorClientOptions> ClientOptions(
    const ConnectionSettings& settings) {
  client::CoordinatorClientOptions o;
  o.address = settings.coordinator.value;
  // The token and the key are secrets: refused when every user of the machine can read them.
  const std::tuple<const Setting*, std::string*, bool> files[] = {
      {&settings.token_file, &o.token, true},
      {&settings.tls_ca, &o.tls_ca, false},
      {&settings.tls_client_cert, &o.tls_client_cert, false},
      {&settings.tls_client_key, &o.tls_client_key, true},
  };
  for (const auto& [setting, into, secret] : files) {
    if (setting->value.empty()) continue;
    auto text = secret ? ReadSecretFile(setting->value) : ReadFile(setting->value);
    if (!text.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(setting->source, ": ", text.status().message()));
    }
    *into = *std::move(text);
  }
  o.token = std::string(absl::StripAsciiWhitespace(o.token));
  if (!settings.token_file.value.empty() && o.token.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        settings.token_file.source, " ", settings.token_file.value, ": the token file is empty"));
  }
  return o;
}

}  // namespace ringmaster::cli
