#!/usr/bin/python3
"""`tessel report`'s page in headless Chromium (Debian's chromium): it loads with no console message at
all (a CSP violation, a failed load or a script error would each print one), and its layout holds at two
window widths: no sideways scrolling of the page, sections stacked without overlap, every chart drawn
with its marks inside it, every table's columns in view (no column behind a scroll bar), and every
kernel with 5 % or more of a target's time named in its timeline and beside its roofline point. The layout is checked by measuring the rendered page (a copy with a checking
script; the page itself carries none) rather than by comparing screenshots pixel by pixel, which breaks
with every Chromium or font update; the screenshot is still taken and kept for people
(docs/decisions.md).

    tests/html_report_browser.py TESSEL_BINARY MODEL [OUT_DIR]

Exit 77 (ctest: skipped) when no chromium is installed.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

CHECK = r"""<script>
(function () {
  const fails = [];
  const W = document.documentElement.clientWidth;
  if (document.documentElement.scrollWidth > W + 1) fails.push('page scrolls sideways: ' + document.documentElement.scrollWidth + ' > ' + W);
  const secs = [...document.querySelectorAll('section')];
  let prev = 0;
  for (const s of secs) {
    const r = s.getBoundingClientRect();
    if (r.height < 40) fails.push(s.id + ' is ' + r.height + ' px high');
    if (r.top + 1 < prev) fails.push(s.id + ' overlaps the section above');
    if (r.right > W + 1) fails.push(s.id + ' is wider than the page');
    prev = r.bottom;
  }
  for (const svg of document.querySelectorAll('svg')) {
    const r = svg.getBoundingClientRect();
    if (r.width < 200 || r.height < 40) fails.push('chart ' + svg.getAttribute('aria-label') + ' is ' + r.width + 'x' + r.height);
  }
  for (const svg of document.querySelectorAll('svg[aria-label=timeline]')) {
    const sr = svg.getBoundingClientRect();
    const bars = svg.querySelectorAll('rect');
    if (bars.length < 10) fails.push('a timeline has ' + bars.length + ' bars');
    for (const b of bars) {
      const r = b.getBoundingClientRect();
      if (r.left < sr.left - 1 || r.right > sr.right + 1 || r.top < sr.top - 1 || r.bottom > sr.bottom + 1) { fails.push('a bar outside its timeline'); break; }
    }
  }
  for (const svg of document.querySelectorAll('svg[aria-label=roofline]')) {
    const sr = svg.getBoundingClientRect();
    const pts = svg.querySelectorAll('circle');
    if (!pts.length) fails.push('a roofline without points');
    for (const c of pts) {
      const r = c.getBoundingClientRect();
      if (r.left < sr.left || r.right > sr.right || r.top < sr.top || r.bottom > sr.bottom) { fails.push('a roofline point outside its plot'); break; }
    }
  }
  // Every column of every table in view from 1280 px on: no table wider than its box (a column behind a
  // scroll bar); narrower windows may scroll a table inside its box.
  if (W >= 1200) for (const t of document.querySelectorAll('table')) {
    const box = t.closest('.tablewrap, .scroll') || t.parentElement;
    const br = box.getBoundingClientRect(), tr = t.getBoundingClientRect();
    if (tr.right > Math.min(br.right, W) + 1) fails.push('a table is ' + Math.round(tr.width) + ' px wide in a box of ' + Math.round(br.width) + ' (first column: ' + (t.querySelector('th') || {}).textContent + ')');
  }
  // Every kernel with 5 % or more of a target's time named without hovering: in the timeline's band row
  // and, where it does arithmetic, beside its roofline point (the kernel table gives names and shares).
  for (const sec of document.querySelectorAll('section')) {
    const kt = sec.querySelector('table.kernels');
    if (!kt) continue;
    const band = new Set([...sec.querySelectorAll('svg[aria-label=timeline] text.band')].map(e => e.textContent));
    const point = new Set([...sec.querySelectorAll('svg[aria-label=roofline] text.point')].map(e => e.textContent));
    for (const row of kt.querySelectorAll('tbody tr')) {
      const cells = row.querySelectorAll('td');
      if (cells.length < 16) continue;
      const name = cells[0].textContent, share = parseFloat(cells[10].textContent), flops = cells[5].textContent.trim();
      if (!(share >= 5)) continue;
      if (!band.has(name)) fails.push(sec.id + ': kernel ' + name + ' (' + share + ' %) not named in the timeline');
      if (flops !== '0' && !point.has(name)) fails.push(sec.id + ': kernel ' + name + ' (' + share + ' %) not named in the roofline');
    }
  }
  for (const h of document.querySelectorAll('h2, h3')) if (h.getBoundingClientRect().height < 10) fails.push('heading ' + h.textContent + ' not shown');
  for (const t of document.querySelectorAll('table')) if (t.getBoundingClientRect().height < 10) fails.push('an empty table');
  document.title = fails.length ? 'LAYOUT FAIL: ' + fails.join('; ') : 'LAYOUT OK ' + secs.length + ' sections';
})();
</script>"""


def chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def browse(browser, url, *args, width=1280, height=900):
    cmd = [browser, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--enable-logging=stderr",
           "--v=0", f"--window-size={width},{height}", *args, url]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180)


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    browser = chromium()
    if not browser:
        print("skipped: no chromium installed (apt-get install chromium)")
        sys.exit(77)
    tessel, model = sys.argv[1], sys.argv[2]
    out = sys.argv[3] if len(sys.argv) > 3 else tempfile.mkdtemp(prefix="tessel_report_")
    os.makedirs(out, exist_ok=True)
    page = os.path.join(out, "report.html")
    r = subprocess.run([tessel, "report", model, "--hw", "spyre,tpu-v5e,cpu", "--iters", "3", "--threads", "2", "-o", page],
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        sys.exit(f"tessel report failed ({r.returncode}):\n{r.stdout}{r.stderr}")
    failures = []
    # 1. The page as written: no console message of any kind.
    r = browse(browser, "file://" + page, "--dump-dom")
    console = [line for line in r.stderr.splitlines() if ":CONSOLE" in line]
    if console:
        failures.append("console messages:\n  " + "\n  ".join(console))
    if "<section" not in r.stdout:
        failures.append("the dumped DOM has no section")
    # 2. Its layout, measured by a checking copy at two widths.
    html = open(page, encoding="utf-8").read()
    checked = re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", html).replace("</body>", CHECK + "</body>")
    copy = os.path.join(out, "report_checked.html")
    with open(copy, "w", encoding="utf-8") as f:
        f.write(checked)
    for width in (1280, 1024):
        r = browse(browser, "file://" + copy, "--dump-dom", width=width)
        title = re.search(r"<title>(.*?)</title>", r.stdout, re.S)
        title = title.group(1) if title else "(no title: the page did not load)"
        print(f"{width} px: {title}")
        if not title.startswith("LAYOUT OK"):
            failures.append(f"{width} px: {title}")
        errors = [line for line in r.stderr.splitlines() if ":CONSOLE" in line]
        if errors:
            failures.append(f"{width} px: console messages of the checking copy:\n  " + "\n  ".join(errors))
    # 3. A screenshot for people (kept in OUT_DIR); a blank or tiny one is a failure.
    shot = os.path.join(out, "report.png")
    browse(browser, "file://" + page, f"--screenshot={shot}", height=2400)
    if not os.path.exists(shot) or os.path.getsize(shot) < 30000:
        failures.append(f"screenshot missing or blank: {shot}")
    if failures:
        sys.exit("FAIL\n" + "\n".join(failures))
    print(f"OK: {page} loads with no console message; layout holds at 1280 and 1024 px; screenshot {shot}")


if __name__ == "__main__":
    main()
