// The event-driven timing engine: in-order engine queues per core, DRAM shared by processor sharing
// (virtual time), interconnect links held along a transfer's path. Model and definitions: docs/sim.md.
#include "tessel/targets/dataflow/sim_engine.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <cmath>

#include "tessel/support/error.h"
#include "tessel/targets/dataflow/cost.h"
#include "tessel/targets/dataflow/links.h"

namespace tessel::dataflow {

namespace {

// What an engine waited on: the class of the dependency that finished last.
enum Cat : uint8_t { cat_compute, cat_dma, cat_interconnect, cat_dependency };

Cat category(TaskKind k) {
  switch (k) {
    case TaskKind::matmul:
    case TaskKind::vector: return cat_compute;
    case TaskKind::dma_load:
    case TaskKind::dma_store: return cat_dma;
    case TaskKind::transfer:
    case TaskKind::reduce: return cat_interconnect;
    case TaskKind::barrier: return cat_dependency;
  }
  return cat_dependency;
}

// Engine queues per core: matrix, vector, DMA (dma_engines lanes), reduce port.
enum QueueKind { q_matrix, q_vector, q_dma, q_reduce, kQueuesPerCore };

enum EvType : uint8_t { ev_done, ev_flow_join, ev_dram, ev_retry };
struct Event {
  double t;
  uint64_t seq;
  int64_t id;
  EvType type;
};
struct EventLater {
  bool operator()(const Event& a, const Event& b) const { return a.t > b.t || (a.t == b.t && a.seq > b.seq); }
};

enum FlowDir : uint8_t { dir_read, dir_write, dir_both };
struct Flow {
  double finish_v;  // the virtual time at which it has received all its bytes
  TaskId task;
  FlowDir dir;
};
struct FlowLater {
  bool operator()(const Flow& a, const Flow& b) const { return a.finish_v > b.finish_v; }
};

[[noreturn]] void task_error(const TaskGraph& g, TaskId id, const std::string& why) {
  throw Error(Location{.pass = "sim"}, fmt::format("task {} '{}' ({}): {}", id, g.label(id), task_kind_name(g.task(id).kind), why));
}

class Engine {
 public:
  Engine(const TaskGraph& g, const HwSpec& hw, const SimOptions& o, SimResult& r)
      : g_(g), hw_(hw), opt_(o), r_(r), n_(g.size()), lanes_per_core_(lanes_per_core(hw)) {}

  void run() {
    validate();
    setup();
    // Tasks with no deps: barriers finish after their delay, the rest go to their queues.
    for (size_t q = 0; q < queues_.size(); ++q) try_start(int(q));
    for (size_t i = 0; i < n_; ++i)
      if (pending_[i] == 0 && g_.task(TaskId(i)).kind == TaskKind::barrier) push(g_.task(TaskId(i)).cycles, ev_done, int64_t(i));
    while (!events_.empty()) {
      std::pop_heap(events_.begin(), events_.end(), EventLater{});
      const Event e = events_.back();
      events_.pop_back();
      now_ = e.t;
      ++r_.events;
      switch (e.type) {
        case ev_done: complete(TaskId(e.id)); break;
        case ev_flow_join: join_flow(TaskId(e.id)); break;
        case ev_dram:
          if (uint64_t(e.id) == dram_gen_) dram_completions();
          break;
        case ev_retry:
          queues_[size_t(e.id)].retry_at = -1;
          try_start(int(e.id));
          break;
      }
    }
    finish();
  }

 private:
  struct Queue {
    std::vector<TaskId> order;  // submission order
    size_t head = 0;
    int first_lane = 0;  // global lane index
    int lanes = 1;
    int busy = 0;
    double retry_at = -1;
    double eff_ready = 0;  // the latest ready time of the tasks started so far, and its cause
    Cat eff_cat = cat_dependency;
  };

  void validate() const {
    const auto cores = int32_t(hw_.cores);
    for (size_t i = 0; i < n_; ++i) {
      const Task& t = g_.task(TaskId(i));
      const auto id = TaskId(i);
      if (t.kind != TaskKind::barrier && (t.core < 0 || t.core >= cores))
        task_error(g_, id, fmt::format("core {} is out of range (the hardware has {} cores)", t.core, cores));
      if (!(t.cycles >= 0) || !std::isfinite(t.cycles)) task_error(g_, id, fmt::format("cycles must be >= 0 (got {})", t.cycles));
      if (t.bytes < 0) task_error(g_, id, fmt::format("bytes must be >= 0 (got {})", t.bytes));
      if (t.kind == TaskKind::transfer || t.kind == TaskKind::reduce) {
        if (t.peer < 0 || t.peer >= cores)
          task_error(g_, id, fmt::format("peer core {} is out of range (the hardware has {} cores)", t.peer, cores));
        if (t.peer == t.core) task_error(g_, id, fmt::format("sends to its own core {}", t.core));
      }
      if (t.fanout < 1 || (t.fanout > 1 && t.kind != TaskKind::dma_load))
        task_error(g_, id, fmt::format("fanout {} (only a dma_load may broadcast, to >= 1 cores)", t.fanout));
      if (t.fanout > cores) task_error(g_, id, fmt::format("fanout {} exceeds the {} cores", t.fanout, cores));
      const int64_t limit = hw_.interconnect.broadcast_limit;
      if (limit > 0 && t.fanout > limit)
        task_error(g_, id, fmt::format("fanout {} exceeds the broadcast limit of {} cores", t.fanout, limit));
      if (t.kind == TaskKind::reduce && (t.elements <= 0 || t.bytes % t.elements != 0))
        task_error(g_, id, fmt::format("needs elements > 0 dividing bytes (got {} elements, {} bytes)", t.elements, t.bytes));
    }
  }

  int queue_of(const Task& t) const {
    int k = q_dma;
    if (t.kind == TaskKind::matmul) k = q_matrix;
    else if (t.kind == TaskKind::vector) k = q_vector;
    else if (t.kind == TaskKind::reduce && hw_.interconnect.reduce_path == ReducePath::separate_reduce_ring) k = q_reduce;
    return t.core * kQueuesPerCore + k;
  }

  void setup() {
    pending_.assign(n_, 0);
    ready_.assign(n_, 0);
    crit_.assign(n_, cat_dependency);
    post_.assign(n_, 0);
    r_.start.assign(n_, 0);
    r_.finish.assign(n_, 0);
    r_.lane_of.assign(n_, -1);
    // Successors in CSR form.
    succ_begin_.assign(n_ + 1, 0);
    for (size_t i = 0; i < n_; ++i) {
      const auto deps = g_.deps(TaskId(i));
      pending_[i] = int32_t(deps.size());
      for (TaskId d : deps) ++succ_begin_[size_t(d) + 1];
    }
    for (size_t i = 0; i < n_; ++i) succ_begin_[i + 1] += succ_begin_[i];
    succ_.resize(g_.dep_count());
    std::vector<uint32_t> fill(succ_begin_.begin(), succ_begin_.end() - 1);
    for (size_t i = 0; i < n_; ++i)
      for (TaskId d : g_.deps(TaskId(i))) succ_[fill[size_t(d)]++] = TaskId(i);

    const int64_t cores = hw_.cores;
    queues_.resize(size_t(cores * kQueuesPerCore));
    for (int64_t c = 0; c < cores; ++c) {
      const int base = int(c) * lanes_per_core_;
      Queue* q = &queues_[size_t(c * kQueuesPerCore)];
      q[q_matrix].first_lane = base + int(Lane::matrix);
      q[q_vector].first_lane = base + int(Lane::vector);
      q[q_dma].first_lane = base + int(Lane::dma0);
      q[q_dma].lanes = int(hw_.dma_engines);
      q[q_reduce].first_lane = base + lanes_per_core_ - 1;
    }
    for (size_t i = 0; i < n_; ++i) {
      const Task& t = g_.task(TaskId(i));
      if (t.kind != TaskKind::barrier) queues_[size_t(queue_of(t))].order.push_back(TaskId(i));
    }
    const size_t lanes = size_t(cores * lanes_per_core_);
    lane_busy_.assign(lanes, false);
    lane_end_.assign(lanes, 0);
    r_.cores = cores;
    r_.lanes_per_core = lanes_per_core_;
    r_.lanes.assign(lanes, LaneStats{});
    link_free_.assign(size_t(link_count(hw_)), 0);
    events_.reserve(1024);
  }

  void push(double t, EvType type, int64_t id) {
    // An infinite or NaN time would never be reached (the run would spin or stop early): out-of-range
    // durations are refused where they first appear.
    if (!std::isfinite(t)) {
      const std::string where = type == ev_dram ? std::string("the DRAM transfers in flight")
                                : type == ev_retry ? fmt::format("engine queue {}", id)
                                                   : fmt::format("task {} '{}'", id, g_.label(TaskId(id)));
      throw Error(Location{.pass = "sim"},
                  fmt::format("simulated time became {} at {} (after cycle {}): a duration or rate is out of range", t,
                              where, now_));
    }
    events_.push_back(Event{t, seq_++, id, type});
    std::push_heap(events_.begin(), events_.end(), EventLater{});
  }

  // Starts the queue's tasks in order while the head is ready and a lane is free.
  void try_start(int qi) {
    Queue& q = queues_[size_t(qi)];
    while (q.head < q.order.size() && q.busy < q.lanes) {
      const TaskId id = q.order[q.head];
      if (pending_[size_t(id)] > 0) return;
      const Task& t = g_.task(id);
      path_.clear();
      const bool on_links = (t.kind == TaskKind::transfer || t.kind == TaskKind::reduce) && uses_links(t);
      if (on_links) {
        route_links(hw_, t.core, t.peer, t.kind == TaskKind::reduce, path_);
        double free_at = 0;
        for (int32_t l : path_) free_at = std::max(free_at, link_free_[size_t(l)]);
        if (free_at > now_) {
          if (q.retry_at != free_at) {
            q.retry_at = free_at;
            push(free_at, ev_retry, qi);
          }
          return;
        }
      }
      int lane = q.first_lane;
      while (lane_busy_[size_t(lane)]) ++lane;
      ++q.head;
      ++q.busy;
      start(id, t, q, lane);
    }
  }

  bool uses_links(const Task& t) const {
    if (hw_.interconnect.topology == Topology::none) return false;
    return t.kind == TaskKind::transfer || hw_.interconnect.reduce_path != ReducePath::dram;
  }

  void start(TaskId id, const Task& t, Queue& q, int lane) {
    // Where the lane's idle time since its last task went (definitions in sim_engine.h).
    Cat cat = crit_[size_t(id)];
    double ready = ready_[size_t(id)];
    if (ready >= q.eff_ready) {
      q.eff_ready = ready;
      q.eff_cat = cat;
    } else {
      ready = q.eff_ready;
      cat = q.eff_cat;
    }
    LaneStats& s = r_.lanes[size_t(lane)];
    const double last = lane_end_[size_t(lane)];
    if (now_ > last) {
      const double waited_dep = std::clamp(ready - last, 0.0, now_ - last);
      add_wait(s, cat, waited_dep);
      add_wait(s, cat_interconnect, now_ - last - waited_dep);  // a ready transfer waiting for links
    }
    ++s.tasks;
    lane_busy_[size_t(lane)] = true;
    r_.start[size_t(id)] = now_;
    r_.lane_of[size_t(id)] = int16_t(lane - t.core * lanes_per_core_);
    const double lat = hw_.dram.latency_cycles;
    switch (t.kind) {
      case TaskKind::matmul:
      case TaskKind::vector:
        r_.scratchpad_bytes += t.spad_bytes;
        push(now_ + t.cycles, ev_done, id);
        break;
      case TaskKind::dma_load:
      case TaskKind::dma_store:
        r_.scratchpad_bytes += t.bytes * t.fanout;
        (t.kind == TaskKind::dma_load ? r_.dram_read_bytes : r_.dram_write_bytes) += t.bytes;
        if (t.bytes == 0) push(now_, ev_done, id);
        else push(now_ + lat, ev_flow_join, id);
        break;
      case TaskKind::transfer:
      case TaskKind::reduce: {
        r_.scratchpad_bytes += 2 * t.bytes;
        if (!path_.empty()) {
          const int h = int(path_.size());
          const double dur = t.kind == TaskKind::transfer
                                 ? transfer_cycles(hw_, t.bytes, h)
                                 : reduce_step_cycles(hw_, t.elements, int(t.bytes / t.elements), h);
          for (int32_t l : path_) link_free_[size_t(l)] = now_ + dur;
          r_.interconnect_bytes += t.bytes;
          r_.interconnect_link_bytes += t.bytes * h;
          push(now_ + dur, ev_done, id);
        } else {
          // Through DRAM: stored by the sender and loaded by the receiver (2 latencies, 2 x bytes); a
          // reduction then adds on the receiver's vector unit.
          r_.dram_read_bytes += t.bytes;
          r_.dram_write_bytes += t.bytes;
          if (t.kind == TaskKind::reduce) post_[size_t(id)] = vector_cycles(hw_, VectorOp::add, t.elements);
          if (t.bytes == 0) push(now_, ev_done, id);
          else push(now_ + 2 * lat, ev_flow_join, id);
        }
        break;
      }
      case TaskKind::barrier: break;
    }
  }

  static void add_wait(LaneStats& s, Cat c, double dt) {
    if (dt <= 0) return;
    switch (c) {
      case cat_compute: s.wait_compute += dt; break;
      case cat_dma: s.wait_dma += dt; break;
      case cat_interconnect: s.wait_interconnect += dt; break;
      case cat_dependency: s.wait_dependency += dt; break;
    }
  }

  void complete(TaskId id) {
    const Task& t = g_.task(id);
    r_.finish[size_t(id)] = now_;
    makespan_ = std::max(makespan_, now_);
    if (t.kind != TaskKind::barrier) {
      const int lane = t.core * lanes_per_core_ + r_.lane_of[size_t(id)];
      lane_busy_[size_t(lane)] = false;
      lane_end_[size_t(lane)] = now_;
      r_.lanes[size_t(lane)].busy += now_ - r_.start[size_t(id)];
      Queue& q = queues_[size_t(queue_of(t))];
      --q.busy;
    } else {
      r_.start[size_t(id)] = now_ - t.cycles;
    }
    const Cat cat = category(t.kind);
    for (uint32_t s = succ_begin_[size_t(id)]; s < succ_begin_[size_t(id) + 1]; ++s) {
      const TaskId n = succ_[s];
      if (now_ >= ready_[size_t(n)]) {
        ready_[size_t(n)] = now_;
        crit_[size_t(n)] = cat;
      }
      if (--pending_[size_t(n)] == 0) {
        const Task& nt = g_.task(n);
        if (nt.kind == TaskKind::barrier) push(now_ + nt.cycles, ev_done, n);
        else try_start(queue_of(nt));
      }
    }
    if (t.kind != TaskKind::barrier) try_start(queue_of(t));
  }

  // ---- DRAM: processor sharing in virtual time. Every active flow receives rate_ bytes per cycle;
  // v_ is the bytes each flow has received since the start, so a flow finishes when v_ reaches its
  // finish_v, whatever the number of flows in between.
  void advance() {
    if (!flows_.empty()) {
      v_ += rate_ * (now_ - t0_);
      r_.dram_busy_cycles += now_ - t0_;
    }
    t0_ = now_;
  }

  void join_flow(TaskId id) {
    const Task& t = g_.task(id);
    advance();
    FlowDir dir = t.kind == TaskKind::dma_load ? dir_read : t.kind == TaskKind::dma_store ? dir_write : dir_both;
    const double bytes = dir == dir_both ? 2.0 * double(t.bytes) : double(t.bytes);
    flows_.push_back(Flow{v_ + bytes, id, dir});
    std::push_heap(flows_.begin(), flows_.end(), FlowLater{});
    if (dir != dir_write) ++n_read_;
    if (dir != dir_read) ++n_write_;
    reschedule_dram();
  }

  void reschedule_dram() {
    ++dram_gen_;
    const double rbpc = dram_bytes_per_cycle(hw_, DmaDir::read, false);
    const double wbpc = dram_bytes_per_cycle(hw_, DmaDir::write, false);
    double cap = 0;
    if (n_read_ > 0 && n_write_ > 0) cap = hw_.dram.mixed_efficiency * std::min(rbpc, wbpc);
    else cap = n_read_ > 0 ? rbpc : wbpc;
    rate_ = flows_.empty() ? 0 : cap / double(flows_.size());
    if (opt_.record_dram_samples) {
      double rd = 0, wr = 0;
      for (const Flow& f : flows_) {
        if (f.dir == dir_read) rd += rate_;
        else if (f.dir == dir_write) wr += rate_;
        else rd += rate_ / 2, wr += rate_ / 2;
      }
      if (!r_.dram_samples.empty() && r_.dram_samples.back().cycle == now_) r_.dram_samples.pop_back();
      r_.dram_samples.push_back(DramSample{now_, rd, wr});
    }
    if (!flows_.empty()) push(now_ + std::max(0.0, flows_.front().finish_v - v_) / rate_, ev_dram, int64_t(dram_gen_));
  }

  void dram_completions() {
    advance();
    done_.clear();
    // A transfer is done when what is left is a rounding residue: under a billionth of its bytes, or
    // less than the bytes the current rate moves in the smallest step time can still take at this
    // magnitude (a few ulps of now_). Without the second test a very fast DRAM (10 PB/s on a 1 MHz
    // clock: 1e10 bytes per cycle) left 0.002 bytes that needed 2e-13 cycles, a step 8153.5 + 2e-13
    // cannot express, and the same event came back at the same instant.
    const double step = 4 * std::numeric_limits<double>::epsilon() * std::max(1.0, now_);
    while (!flows_.empty() &&
           flows_.front().finish_v <= v_ + std::max(1e-9 * std::max(1.0, std::abs(flows_.front().finish_v)), rate_ * step)) {
      std::pop_heap(flows_.begin(), flows_.end(), FlowLater{});
      const Flow f = flows_.back();
      flows_.pop_back();
      if (f.dir != dir_write) --n_read_;
      if (f.dir != dir_read) --n_write_;
      done_.push_back(f.task);
    }
    watch_dram_progress();
    reschedule_dram();
    for (TaskId id : done_) {
      if (post_[size_t(id)] > 0) push(now_ + post_[size_t(id)], ev_done, id);
      else complete(id);
    }
  }

  // A DRAM event that completes no transfer happens only through rounding, once or twice in a row.
  // Many in a row mean time no longer advances at this magnitude (a step below the precision of the
  // current time: durations far out of proportion): stop with an error instead of spinning.
  void watch_dram_progress() {
    if (!done_.empty()) {
      dram_idle_rounds_ = 0;
      return;
    }
    if (++dram_idle_rounds_ > kMaxIdleDramRounds)
      throw Error(Location{.pass = "sim"},
                  fmt::format("no progress: the DRAM transfers in flight at cycle {} do not advance ({} bytes left, {} "
                              "bytes per cycle each); the hardware description's times are out of proportion",
                              now_, flows_.front().finish_v - v_, rate_));
  }

  void finish() {
    for (size_t i = 0; i < n_; ++i)
      if (pending_[i] > 0) task_error(g_, TaskId(i), "never became ready (internal error)");
    for (const Queue& q : queues_)
      if (q.head != q.order.size()) task_error(g_, q.order[q.head], "never started (internal error)");
    r_.cycles = makespan_;
    r_.seconds = hw_.seconds(makespan_);
    for (size_t l = 0; l < lane_end_.size(); ++l) r_.lanes[l].idle = makespan_ - lane_end_[l];
  }

  const TaskGraph& g_;
  const HwSpec& hw_;
  const SimOptions& opt_;
  SimResult& r_;
  const size_t n_;
  const int lanes_per_core_;
  double now_ = 0, makespan_ = 0;
  uint64_t seq_ = 0;
  std::vector<Event> events_;
  std::vector<int32_t> pending_;
  std::vector<double> ready_;
  std::vector<Cat> crit_;
  std::vector<double> post_;
  std::vector<uint32_t> succ_begin_;
  std::vector<TaskId> succ_;
  std::vector<Queue> queues_;
  std::vector<bool> lane_busy_;
  std::vector<double> lane_end_;
  std::vector<double> link_free_;
  std::vector<int32_t> path_;
  std::vector<Flow> flows_;
  std::vector<TaskId> done_;
  double v_ = 0, t0_ = 0, rate_ = 0;
  int n_read_ = 0, n_write_ = 0;
  uint64_t dram_gen_ = 0;
  static constexpr int kMaxIdleDramRounds = 64;
  int dram_idle_rounds_ = 0;
};

}  // namespace

int lanes_per_core(const HwSpec& hw) { return 3 + int(hw.dma_engines); }

std::string lane_name(const HwSpec& hw, int lane) {
  if (lane == int(Lane::matrix)) return "matrix";
  if (lane == int(Lane::vector)) return "vector";
  if (lane == lanes_per_core(hw) - 1) return "reduce";
  return fmt::format("dma {}", lane - int(Lane::dma0));
}

double SimResult::core_busy_fraction(int core) const {
  if (cycles <= 0) return 0;
  double busy = 0;
  for (int l = 0; l < lanes_per_core; ++l) busy = std::max(busy, lane(core, l).busy);
  return busy / cycles;
}

SimResult simulate(const TaskGraph& g, const HwSpec& hw, const SimOptions& options) {
  SimResult r;
  Engine(g, hw, options, r).run();
  return r;
}

}  // namespace tessel::dataflow
