#include <catch2/catch.hpp>

#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>

#include <boost/filesystem.hpp>

#include "engine/store/sqlite.h"
#include "support/process.h"
#include "support/temp_dir.h"

using namespace chiar;

namespace {

int sh(const std::string& command, const std::string& log) {
  const int rc = std::system((command + " >> '" + log + "' 2>&1").c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

std::string read(const std::string& file) {
  std::ifstream in(file);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

}  // namespace

TEST_CASE("scaffolded plugins build out of tree against an installed harness and run in a matrix", "[scaffold][slow]") {
  test::TempDir d("scaffold");
  const std::string prefix = d.path() + "/prefix", log = d.path() + "/log.txt";
  // A failing step reports the log as it stands after that step.
  const auto step = [&](const std::string& command) {
    const int rc = sh(command, log);
    INFO(command << "\n" << read(log));
    REQUIRE(rc == 0);
  };
  step("cmake --install '" + std::string(CHIAR_BINARY_DIR) + "' --prefix '" + prefix + "'");
  const std::string chiar = prefix + "/bin/chiar";
  std::string plugin_dirs;
  for (const char* kind : {"operator", "router", "task"}) {
    const std::string name = std::string("my_") + kind, dir = d.path() + "/" + name;
    INFO(kind);
    step("'" + chiar + "' new-plugin " + kind + " " + name + " --dir '" + d.path() + "'");
    for (const char* f : {"CMakeLists.txt", "README.md"}) CHECK(boost::filesystem::exists(dir + "/" + f));
    step("cmake -S '" + dir + "' -B '" + dir + "/build' -G Ninja -DCMAKE_PREFIX_PATH='" + prefix + "'");
    step("cmake --build '" + dir + "/build'");
    step("ctest --test-dir '" + dir + "/build' --output-on-failure");
    plugin_dirs += " --plugin-dir '" + dir + "/build/plugins'";
  }
  std::ofstream(d.path() + "/m.toml") << R"([matrix]
name = "scaffold"
variants = ["mine"]
tasks = ["digits"]
seeds = [0]
[model]
d_model = 16
n_heads = 2
[train]
steps = 2
batch_size = 4
eval_batch_size = 16
calibration_batches = 1
[variants.mine]
layers = ["dct", "dct|my_operator", "attn"]
router = "my_router"
[tasks.digits]
plugin = "my_task"
n = 200
)";
  const std::string db = d.path() + "/s.db";
  const int rc = sh("'" + chiar + "'" + plugin_dirs + " run '" + d.path() + "/m.toml' --db '" + db + "'", log);
  INFO(read(log));
  CHECK(rc == 0);
  engine::Database con(db);
  auto q = con.prepare("SELECT status FROM runs");
  REQUIRE(q.step());
  CHECK(q.text(0) == "done");

  const auto again = test::run_chiar({"new-plugin", "operator", "my_operator", "--dir", d.path()});
  CHECK(again.status == 2);
  CHECK(again.output == "chiar: new-plugin: '" + d.path() + "/my_operator' already exists\n");
  CHECK(test::run_chiar({"new-plugin", "layer", "x"}).output ==
        "chiar: new-plugin: kind must be operator, router or task, found 'layer'\n");
  // A name (or alias) a loaded plugin registers could never load beside it.
  const auto taken = test::run_chiar({"new-plugin", "operator", "attn", "--dir", d.path()});
  CHECK(taken.status == 2);
  CHECK_THAT(taken.output,
             Catch::Matchers::StartsWith("chiar: new-plugin: operator 'attn' is already registered by '"));
  CHECK_THAT(taken.output, Catch::Matchers::EndsWith("libchiar_attention.so', and the loader refuses a second; "
                                                     "choose another name\n"));
  CHECK_FALSE(boost::filesystem::exists(d.path() + "/attn"));
  // A folder that cannot be made (a file stands where it would go) is the
  // environment's failure: exit 3, one line.
  d.write("afile", "x");
  const auto unwritable = test::run_chiar({"new-plugin", "router", "fresh", "--dir", d.path() + "/afile"});
  CHECK(unwritable.status == 3);
  CHECK_THAT(unwritable.output,
             Catch::Matchers::StartsWith("chiar: " + d.path() + "/afile/fresh: cannot create the folder: "));
  CHECK(std::count(unwritable.output.begin(), unwritable.output.end(), '\n') == 1);
}
