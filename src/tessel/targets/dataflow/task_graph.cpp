// TaskGraph: tasks in submission order, dependencies in one flat array, interned labels.
#include <fmt/format.h>

#include "tessel/support/error.h"
#include "tessel/targets/dataflow/sim_engine.h"

namespace tessel::dataflow {

const char* task_kind_name(TaskKind k) {
  switch (k) {
    case TaskKind::matmul: return "matmul";
    case TaskKind::vector: return "vector";
    case TaskKind::dma_load: return "dma_load";
    case TaskKind::dma_store: return "dma_store";
    case TaskKind::transfer: return "transfer";
    case TaskKind::reduce: return "reduce";
    case TaskKind::barrier: return "barrier";
  }
  return "?";
}

TaskId TaskGraph::add(const Task& t, std::span<const TaskId> deps) {
  const auto id = TaskId(tasks_.size());
  for (TaskId d : deps)
    if (d < 0 || d >= id)
      throw Error(Location{.pass = "sim"}, fmt::format("task {} ({}): dependency {} is not an earlier task", id,
                                                       task_kind_name(t.kind), d));
  if (t.label >= int32_t(labels_.size()))
    throw Error(Location{.pass = "sim"}, fmt::format("task {} ({}): label {} was not interned", id, task_kind_name(t.kind), t.label));
  tasks_.push_back(t);
  deps_.insert(deps_.end(), deps.begin(), deps.end());
  dep_begin_.push_back(uint32_t(deps_.size()));
  return id;
}

int32_t TaskGraph::intern(std::string_view label) {
  auto [it, inserted] = label_ids_.try_emplace(std::string(label), int32_t(labels_.size()));
  if (inserted) labels_.emplace_back(label);
  return it->second;
}

void TaskGraph::reserve(size_t tasks, size_t deps) {
  tasks_.reserve(tasks);
  dep_begin_.reserve(tasks + 1);
  deps_.reserve(deps);
}

std::string_view TaskGraph::label(TaskId id) const {
  const Task& t = task(id);
  return t.label >= 0 ? std::string_view(labels_[size_t(t.label)]) : std::string_view(task_kind_name(t.kind));
}

}  // namespace tessel::dataflow
