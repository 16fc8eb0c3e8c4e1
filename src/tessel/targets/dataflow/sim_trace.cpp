// A simulated run as Chrome / Perfetto trace JSON ("traceEvents", "X" events in microseconds).
#include <fmt/format.h>

#include "tessel/support/escape.h"
#include "tessel/targets/dataflow/sim_engine.h"

namespace tessel::dataflow {

std::string chrome_trace_json(const TaskGraph& g, const HwSpec& hw, const SimResult& r) {
  const double us_per_cycle = 1.0 / (hw.clock_ghz * 1000.0);
  const int cores = int(hw.cores);
  const int dram_pid = cores, sync_pid = cores + 1;
  std::string out;
  out.reserve(g.size() * 160 + 4096);
  // Written by hand for speed (one event per task); every name goes through json_string_literal.
  out += "{\"displayTimeUnit\":\"ns\",\"otherData\":{\"hw\":";
  out += json_string_literal(hw.name);
  out += fmt::format(",\"cycles\":{:.3f},\"clock_ghz\":{}}},\"traceEvents\":[\n", r.cycles, hw.clock_ghz);
  bool first = true;
  auto sep = [&] {
    if (!first) out += ",\n";
    first = false;
  };
  std::vector<char> core_used(size_t(cores), 0);
  bool sync_used = false;
  for (size_t i = 0; i < g.size(); ++i) {
    const Task& t = g.task(TaskId(i));
    if (t.kind == TaskKind::barrier) {
      if (t.cycles <= 0) continue;
      sync_used = true;
    } else {
      core_used[size_t(t.core)] = 1;
    }
    const int pid = t.kind == TaskKind::barrier ? sync_pid : t.core;
    const int tid = t.kind == TaskKind::barrier ? 0 : r.lane_of[i];
    sep();
    out += "{\"name\":";
    out += json_string_literal(g.label(TaskId(i)));
    out += fmt::format(",\"cat\":\"{}\",\"ph\":\"X\",\"pid\":{},\"tid\":{},\"ts\":{:.4f},\"dur\":{:.4f},\"args\":{{\"task\":{}",
                       task_kind_name(t.kind), pid, tid, r.start[i] * us_per_cycle,
                       (r.finish[i] - r.start[i]) * us_per_cycle, i);
    if (t.kernel >= 0) out += fmt::format(",\"kernel\":{}", t.kernel);
    if (t.bytes > 0) out += fmt::format(",\"bytes\":{}", t.bytes);
    if (t.peer >= 0) out += fmt::format(",\"peer\":{}", t.peer);
    out += "}}";
  }
  for (int c = 0; c < cores; ++c) {
    if (!core_used[size_t(c)]) continue;
    sep();
    out += fmt::format("{{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":{},\"args\":{{\"name\":\"core {}\"}}}}", c, c);
    sep();
    out += fmt::format("{{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":{},\"args\":{{\"sort_index\":{}}}}}", c, c);
    for (int l = 0; l < r.lanes_per_core; ++l) {
      sep();
      out += fmt::format("{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":{},\"tid\":{},\"args\":{{\"name\":{}}}}}", c, l,
                         json_string_literal(lane_name(hw, l)));
    }
  }
  if (sync_used) {
    sep();
    out += fmt::format("{{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":{},\"args\":{{\"name\":\"sync\"}}}}", sync_pid);
  }
  if (!r.dram_samples.empty()) {
    sep();
    out += fmt::format("{{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":{},\"args\":{{\"name\":\"DRAM\"}}}}", dram_pid);
    const double gbps = hw.clock_ghz;  // bytes per cycle x cycles per ns = GB/s
    for (const DramSample& s : r.dram_samples) {
      sep();
      out += fmt::format("{{\"name\":\"DRAM GB/s\",\"ph\":\"C\",\"pid\":{},\"ts\":{:.4f},\"args\":{{\"read\":{:.3f},\"write\":{:.3f}}}}}",
                         dram_pid, s.cycle * us_per_cycle, s.read_bytes_per_cycle * gbps, s.write_bytes_per_cycle * gbps);
    }
  }
  out += "\n]}\n";
  return out;
}

}  // namespace tessel::dataflow
