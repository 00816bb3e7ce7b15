// trex plot RUN_DIR [--out FILE.png]: draws a run's metrics.jsonl with gnuplot (Debian
// gnuplot-nox): training and eval loss, MFU, and a heat map of expert load balance (busiest
// expert / mean, per MoE layer and step). The data goes to RUN_DIR/plot/*.dat next to the
// gnuplot script, so the figure can be re-rendered or restyled by hand. One point per step: where
// a step was logged twice the last line wins (train/metrics.h: read_metrics).
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include "cli/commands.h"
#include "core/error.h"
#include "train/metrics.h"

namespace trex::cli {

namespace fs = std::filesystem;

void add_plot(CLI::App& app) {
  auto* cmd = app.add_subcommand("plot", "plot a run's loss, MFU and expert-load heat map to PNG (gnuplot)");
  auto run_dir = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  cmd->add_option("run_dir", *run_dir, "run directory (holds metrics.jsonl)")->required();
  cmd->add_option("--out", *out, "PNG file (default RUN_DIR/plot.png)");
  cmd->callback([run_dir, out] {
    const fs::path dir(*run_dir), metrics = dir / "metrics.jsonl";
    // One record per step (a step logged twice, in files from before resumes cut the file back:
    // the last line wins), in step order.
    const std::vector<nlohmann::json> records = train::read_metrics(metrics.string());
    const fs::path pd = dir / "plot";
    std::error_code ec;
    fs::create_directories(pd, ec);
    TREX_USER_CHECK(!ec, "give a run directory you may write to", pd.string(), ": cannot create directory: ",
                    ec.message());
    std::ofstream loss(pd / "loss.dat"), eval(pd / "eval.dat"), mfu(pd / "mfu.dat"), load(pd / "load.dat");
    int64_t n = 0, layers = 0;
    for (const nlohmann::json& j : records) {
      const int64_t s = j["step"].get<int64_t>();
      loss << s << " " << j["loss"].get<double>() << "\n";
      if (j.contains("eval_loss")) eval << s << " " << j["eval_loss"].get<double>() << "\n";
      mfu << s << " " << 100.0 * j.value("mfu", 0.0) << "\n";
      if (j.contains("expert_load_max_over_mean")) {
        const auto& lb = j["expert_load_max_over_mean"];
        layers = std::max<int64_t>(layers, lb.size());
        for (size_t l = 0; l < lb.size(); ++l) load << s << " " << l << " " << lb[l].get<double>() << "\n";
        load << "\n";
      }
      ++n;
    }
    TREX_USER_CHECK(n > 0, "train at least one step first", metrics.string(), ": no records");
    for (auto* f : {&loss, &eval, &mfu, &load}) f->close();
    const std::string png = out->empty() ? (dir / "plot.png").string() : *out;
    const bool has_eval = fs::file_size(pd / "eval.dat") > 0, has_load = layers > 0;
    std::ofstream gp(pd / "plot.gp");
    gp << "set terminal pngcairo size 1500,450 font ',10'\nset output '" << png << "'\n"
       << "set multiplot layout 1," << (has_load ? 3 : 2) << "\nset grid\nset xlabel 'step'\n"
       << "set title 'loss'\nplot '" << (pd / "loss.dat").string() << "' w l lw 2 t 'train'"
       << (has_eval ? ", '" + (pd / "eval.dat").string() + "' w lp pt 7 t 'eval'" : std::string()) << "\n"
       << "set title 'MFU (%)'\nplot '" << (pd / "mfu.dat").string() << "' w l lw 2 notitle\n";
    if (has_load)
      gp << "set title 'expert load: busiest / mean, per MoE layer'\nset ylabel 'MoE layer'\nunset grid\n"
         << "set palette defined (0 'white', 1 'yellow', 2 'red')\nset ytics 1\nset yrange [-0.5:" << layers - 0.5 << "]\n"
         << "set style fill solid 1.0 noborder\n"
         << "plot '" << (pd / "load.dat").string() << "' u 1:2:(0.5):(0.5):3 w boxxy lc palette notitle\n";
    gp << "unset multiplot\n";
    gp.close();
    const std::string cmdline = "gnuplot '" + (pd / "plot.gp").string() + "'";
    TREX_USER_CHECK(std::system(cmdline.c_str()) == 0 && fs::exists(png),
                    "install gnuplot (Debian: gnuplot-nox; scripts/deps.sh does it)", "gnuplot failed on ",
                    (pd / "plot.gp").string());
    std::printf("{\"png\": \"%s\", \"records\": %lld}\n", png.c_str(), (long long)n);
  });
}

}  // namespace trex::cli
