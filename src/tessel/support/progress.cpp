// The progress line (support/progress.h): figures, rate, ETA; drawn in place or logged.
#include "tessel/support/progress.h"

#include <fmt/format.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>

namespace tessel {
namespace {

std::atomic<ProgressMode> g_mode{ProgressMode::automatic};

double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int terminal_width() {
  winsize w{};
  if (ioctl(STDERR_FILENO, TIOCGWINSZ, &w) == 0 && w.ws_col > 20) return w.ws_col;
  return 100;
}

}  // namespace

void set_progress_mode(ProgressMode mode) { g_mode = mode; }
ProgressMode progress_mode() { return g_mode; }

std::string duration_text(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const long t = std::lround(s);
  if (t < 60) return fmt::format("{} s", t);
  if (t < 3600) return fmt::format("{} min {:02} s", t / 60, t % 60);
  return fmt::format("{} h {:02} min", t / 3600, (t % 3600) / 60);
}

Progress::Progress(std::string what, size_t total, std::string unit, ProgressOptions opts)
    : what_(std::move(what)), unit_(std::move(unit)), total_(total), o_(std::move(opts)) {
  if (!o_.clock) o_.clock = steady_seconds;
  if (!o_.write)
    o_.write = [](const std::string& s) {
      std::fputs(s.c_str(), stderr);
      std::fflush(stderr);
    };
  mode_ = o_.mode;
  if (mode_ == ProgressMode::automatic) mode_ = isatty(STDERR_FILENO) ? ProgressMode::terminal : ProgressMode::lines;
  if (mode_ == ProgressMode::terminal && o_.width <= 0) o_.width = terminal_width();
  start_ = now();
}

Progress::~Progress() { finish(); }

double Progress::now() const { return o_.clock(); }

std::string Progress::text() const {
  const double el = now() - start_;
  std::string s = what_ + ": ";
  if (total_ > 0) s += fmt::format("{}/{} {} ({}%)", done_, total_, unit_, done_ * 100 / total_);
  else s += fmt::format("{} {}", done_, unit_);
  if (o_.eta && done_ > 0 && el > 0) {
    const double rate = static_cast<double>(done_) / el;
    s += rate >= 1 ? fmt::format(", {:.1f} {}/s", rate, unit_) : fmt::format(", {:.1f} s each", 1 / rate);
    if (total_ > done_) s += ", ETA " + duration_text(static_cast<double>(total_ - done_) / rate);
  }
  s += ", " + duration_text(el);
  if (!note_.empty()) s += ": " + note_;
  return s;
}

void Progress::show(bool final) {
  const double t = now();
  if (mode_ == ProgressMode::quiet) return;
  if (!final) {
    if (t - start_ < (mode_ == ProgressMode::lines ? o_.log_every_s : o_.delay_s)) return;
    const double every = mode_ == ProgressMode::lines ? o_.log_every_s : o_.redraw_s;
    if (last_shown_ >= 0 && t - last_shown_ < every) return;
  } else if (!shown_) {
    return;  // short work: nothing was shown, nothing to end
  }
  last_shown_ = t;
  shown_ = true;
  std::string line = text();
  if (mode_ == ProgressMode::lines) {
    o_.write(line + (final ? " (done)\n" : "\n"));
    return;
  }
  if (final) {
    o_.write("\r\x1b[K");  // the caller prints its own summary on a clean line
    return;
  }
  const size_t w = static_cast<size_t>(std::max(20, o_.width - 1));
  if (line.size() > w) line = line.substr(0, w - 3) + "...";
  o_.write("\r" + line + "\x1b[K");
}

void Progress::advance(size_t n, const std::string& note) {
  std::lock_guard lk(mu_);
  done_ += n;
  if (!note.empty()) note_ = note;
  if (!finished_) show(false);
}

void Progress::note(const std::string& note) {
  std::lock_guard lk(mu_);
  note_ = note;
  if (!finished_) show(false);
}

void Progress::log(const std::string& line) {
  std::lock_guard lk(mu_);
  const bool redraw = mode_ == ProgressMode::terminal && shown_ && !finished_;
  o_.write((redraw ? "\r\x1b[K" : "") + line + "\n");
  if (redraw) {
    last_shown_ = -1;
    show(false);
  }
}

void Progress::tick() {
  std::lock_guard lk(mu_);
  if (!finished_) show(false);
}

void Progress::finish() {
  std::lock_guard lk(mu_);
  if (finished_) return;
  finished_ = true;
  note_.clear();
  show(true);
}

ProgressTicker::ProgressTicker(Progress& p, double every_s) : p_(p) {
  const auto every = std::chrono::duration<double>(every_s);
  thread_ = std::thread([this, every] {
    std::unique_lock lk(mu_);
    while (!cv_.wait_for(lk, every, [this] { return stop_; })) p_.tick();
  });
}

ProgressTicker::~ProgressTicker() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  thread_.join();
}

}  // namespace tessel
