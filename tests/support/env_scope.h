#pragma once
// An environment variable set for the children a test starts
// (test::run_chiar inherits the environment), and what was there before
// put back when the scope ends.
#include <cstdlib>
#include <optional>
#include <string>
#include <utility>

namespace chiar::test {

class EnvScope {
 public:
  EnvScope(std::string name, const std::string& value) : name_(std::move(name)) {
    if (const char* old = std::getenv(name_.c_str())) old_ = old;
    setenv(name_.c_str(), value.c_str(), 1);
  }
  ~EnvScope() {
    if (old_)
      setenv(name_.c_str(), old_->c_str(), 1);
    else
      unsetenv(name_.c_str());
  }
  EnvScope(const EnvScope&) = delete;
  EnvScope& operator=(const EnvScope&) = delete;

 private:
  std::string name_;
  std::optional<std::string> old_;
};

}  // namespace chiar::test
