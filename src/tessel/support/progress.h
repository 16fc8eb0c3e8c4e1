// Progress of long work (a conformance run, a large model's compile, a sweep) on stderr: a line redrawn
// in place with the rate and ETA on a terminal, a plain log line every few seconds when stderr is not a
// terminal, nothing when quiet (`tessel --quiet`). Never on stdout, so `--json` output stays clean.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace tessel {

enum class ProgressMode {
  automatic,  // terminal when stderr is one, else lines
  terminal,   // one line, redrawn with a carriage return
  lines,      // a plain line every log_every_s
  quiet,      // nothing
};

// The process-wide default (automatic until the CLI's --quiet sets quiet).
void set_progress_mode(ProgressMode mode);
ProgressMode progress_mode();

struct ProgressOptions {
  ProgressMode mode = progress_mode();
  double delay_s = 1.0;       // nothing is shown before this: short work stays silent
  double redraw_s = 0.25;     // terminal: the line is redrawn at most this often
  double log_every_s = 10.0;  // lines: a line at most this often (the first after this long, too)
  bool eta = true;            // the rate and ETA (false for steps of very different lengths)
  int width = 0;              // terminal: columns (0: the terminal's, else 100)
  std::function<double()> clock;                   // seconds; default: a steady clock (tests inject one)
  std::function<void(const std::string&)> write;  // default: to stderr, flushed
};

class Progress {
 public:
  // `what` names the work ("conformance node"), `total` the steps (0: unknown), `unit` a step ("tests").
  Progress(std::string what, size_t total, std::string unit, ProgressOptions opts = {});
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // `n` more steps done; `note` says what is under way now (shown after the figures).
  void advance(size_t n = 1, const std::string& note = "");
  // What is under way now, without a step done (e.g. "C++ compiler").
  void note(const std::string& note);
  // A line of its own (e.g. each finished test under -v), above the progress line; written even when quiet.
  void log(const std::string& line);
  // Redraws or logs if due: from the caller's loop, or a ProgressTicker's thread.
  void tick();
  // Ends the display: clears the terminal line; in lines mode a last line, when any was written.
  void finish();

  // The figures as one line: "conformance node: 120/1700 tests (7%), 3.4 tests/s, ETA 7 min 45 s, 35 s: test_abs".
  std::string text() const;

 private:
  void show(bool final);
  double now() const;

  std::string what_, unit_, note_;
  size_t total_, done_ = 0;
  ProgressOptions o_;
  ProgressMode mode_;
  double start_, last_shown_ = -1;
  bool shown_ = false, finished_ = false;
  mutable std::mutex mu_;
};

// Calls progress.tick() every redraw interval on a thread of its own while it lives: for work that does
// not return to a loop (one C++ compiler run). Not around fork(): a child would inherit a held lock.
class ProgressTicker {
 public:
  explicit ProgressTicker(Progress& p, double every_s = 0.25);
  ~ProgressTicker();

 private:
  Progress& p_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

// "45 s", "7 min 45 s", "2 h 05 min".
std::string duration_text(double seconds);

}  // namespace tessel
