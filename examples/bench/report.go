package main

import (
	"cmp"
	"context"
	"fmt"
	"image/color"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"
)

// row is one cell's measurements and verdict.
type row struct {
	cell
	Successes, Conflicts, Errors int
	// Throughput is operations (successes and lost races) per second of
	// the timed window: those that ended inside it, over its length.
	Throughput    float64
	P50, P99, Max time.Duration
	Retries       int64
	// HotThroughput is the hot key's share of Throughput, and ColdP99 the
	// other keys' p99 (mixed only).
	HotThroughput float64
	ColdP99       time.Duration
	// Modes counts adaptive's calls by the mode they began in.
	Modes      modes
	FirstError string
	// Violation says how the invariant broke; "" when it held.
	Violation string
	// Skipped says why the cell did not run.
	Skipped string
}

func (r *row) fill(o outcome) {
	r.Successes, r.Conflicts, r.Errors = o.Successes, o.Conflicts, o.Errors
	if o.Window > 0 {
		r.Throughput = float64(o.InWindow) / o.Window.Seconds()
	}
	r.P50, r.P99 = o.Percentile(0.5), o.Percentile(0.99)
	if n := len(o.Latencies); n > 0 {
		r.Max = o.Latencies[n-1]
	}
	r.Retries = o.Retries
	r.Modes = o.Modes
	if o.Window > 0 {
		r.HotThroughput = float64(o.HotInWindow) / o.Window.Seconds()
	}
	if n := len(o.ColdLatencies); n > 0 {
		r.ColdP99 = o.ColdLatencies[min(n-1, int(float64(n)*0.99))]
	}
	if len(o.FirstErrors) > 0 {
		r.FirstError = o.FirstErrors[0]
	}
}

// expectedBreak reports whether a broken invariant is the point of the cell:
// the naive control across processes, which a process-local mutex cannot
// guard, and the retry storm's check-then-insert, whose concurrent copies
// both find no effect.
func (r row) expectedBreak() bool {
	return (r.Strategy == "naive" && r.Processes > 1) || r.Strategy == "check-then-insert"
}

// failed reports whether the cell fails the run.
func (r row) failed() bool {
	if r.Skipped != "" {
		return false
	}
	return (r.Violation != "" && !r.expectedBreak()) || r.Errors > 0
}

func (r row) verdict() string {
	switch {
	case r.Skipped != "":
		return "skipped: " + r.Skipped
	case r.Violation != "" && r.expectedBreak():
		return "broken, as expected of the control: " + r.Violation
	case r.Violation != "":
		return "BROKEN: " + r.Violation
	case r.Errors > 0:
		return fmt.Sprintf("ERRORS: %d (%s)", r.Errors, r.FirstError)
	case r.expectedBreak():
		return "held (the control may break here; it did not this time)"
	}
	return "ok"
}

func failures(rows []row) []row {
	var out []row
	for _, r := range rows {
		if r.failed() {
			out = append(out, r)
		}
	}
	return out
}

func perSuccess(n int64, r row) string {
	if r.Successes == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", float64(n)/float64(r.Successes))
}

// retries shows the retries only where the strategy reports them.
func retries(r row) string {
	if !countsRetries(r.Strategy) {
		return "-"
	}
	return perSuccess(r.Retries, r)
}

// vsRaw is a cell's throughput as a multiple of its floor's in the same
// cell: raw-pgx's for the pgx strategies, raw-mariadb's for the MariaDB ones,
// raw's for the others and for those two floors.
func vsRaw(rows []row, r row) string {
	if o, ok := sibling(rows, r, floor(r.Strategy)); ok && o.Throughput > 0 {
		return fmt.Sprintf("%.2f", r.Throughput/o.Throughput)
	}
	return "-"
}

// sibling is strategy's row in r's cell, if it ran there.
func sibling(rows []row, r row, strategy string) (row, bool) {
	c := r.cell
	c.Strategy = strategy
	for _, o := range rows {
		if o.cell == c && o.Skipped == "" {
			return o, true
		}
	}
	return row{}, false
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f", float64(d)/float64(time.Millisecond)) }

// lostShare is the share of operations that lost their race, in percent.
// A ratio to the successes would read as noise where successes are few by
// design: the hot key's one job is claimed once, and every later call loses.
func lostShare(r row) string {
	ops := r.Successes + r.Conflicts
	if ops == 0 {
		return "-"
	}
	pct := 100 * float64(r.Conflicts) / float64(ops)
	// Rounded, one win in thousands would read as none, and the reverse.
	switch {
	case r.Successes > 0 && pct > 99.95:
		return ">99.9%"
	case r.Conflicts > 0 && pct < 0.05:
		return "<0.1%"
	}
	return fmt.Sprintf("%.1f%%", pct)
}

var columns = []string{"workload", "keys", "workers", "procs", "strategy", "ops/s", "×raw", "ok", "lost", "lost %", "retries/ok", "p50 ms", "p99 ms", "max ms", "invariant"}

func fields(rows []row, r row) []string {
	if r.Skipped != "" {
		return []string{r.Workload, r.keyChoice(), fmt.Sprint(r.Workers), fmt.Sprint(r.Processes), r.Strategy, "-", "-", "-", "-", "-", "-", "-", "-", "-", r.verdict()}
	}
	return []string{r.Workload, r.keyChoice(), fmt.Sprint(r.Workers), fmt.Sprint(r.Processes), r.Strategy,
		fmt.Sprintf("%.0f", r.Throughput), vsRaw(rows, r), fmt.Sprint(r.Successes),
		fmt.Sprint(r.Conflicts), lostShare(r), retries(r), ms(r.P50), ms(r.P99), ms(r.Max), r.verdict()}
}

func writeTable(w io.Writer, rows []row) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, strings.Join(columns, "\t")+"\t")
	for i, r := range rows {
		if i > 0 && (r.Workload != rows[i-1].Workload || r.Keys != rows[i-1].Keys ||
			r.Workers != rows[i-1].Workers || r.Processes != rows[i-1].Processes) {
			fmt.Fprintln(tw, strings.Repeat("\t", len(columns)))
		}
		fmt.Fprintln(tw, strings.Join(fields(rows, r), "\t")+"\t")
	}
	tw.Flush()
}

// writeReport writes results.md and one chart per workload, as SVG and PNG, to o.Out and
// returns their paths.
func writeReport(ctx context.Context, admins servers, o Options, rows []row, took time.Duration) ([]string, error) {
	if err := os.MkdirAll(o.Out, 0o755); err != nil {
		return nil, err
	}
	var pgVersion string
	if err := admins.postgres.GetContext(ctx, &pgVersion, `SHOW server_version`); err != nil {
		return nil, err
	}
	if admins.mariadb != nil {
		var v string
		if err := admins.mariadb.GetContext(ctx, &v, `SELECT VERSION()`); err != nil {
			return nil, err
		}
		pgVersion += ", MariaDB " + v
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# contend benchmark results\n\n")
	fmt.Fprintf(&b, "Measured %s on %s/%s, %d CPUs, %s, PostgreSQL %s, in %s.\n\n",
		time.Now().UTC().Format("2006-01-02 15:04 MST"), runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.Version(), pgVersion, took.Round(time.Second))
	fmt.Fprintf(&b, "Command: `%s` (%s per cell, %d process(es), median of %d round(s)).\n\n", strings.TrimSpace(o.Command), o.Duration, o.Processes, o.Rounds)
	b.WriteString("ops/s counts the operations, successes and lost races alike, that ended inside the timed window, over its length; " +
		"the operations still in flight at the deadline finish (so that every success can be checked against the table) " +
		"and count in ok and lost, not in ops/s. ×raw is ops/s over the raw statement's in the same cell, through the same driver on the same server: " +
		"raw-pgx's for the -pgx strategies, raw-mariadb's for the -mariadb ones (which run on MariaDB), raw's for the others and for those two floors. " +
		"ok counts successes. lost counts lost races, a normal answer and not an error: \"sold out\" or \"already claimed\", " +
		"or a strategy that gave up on a busy key; lost % is their share of all operations. " +
		"In decrement the stock never runs out, so lost stays 0 unless a strategy gives up; in claim each job can be claimed once, " +
		"so ok is at most the number of jobs and every later call loses: on the hot key nearly 100% lost is the workload, not a fault. " +
		"shift is decrement on keys spread at random for the first half of the window and on one of them, hot, for the second; " +
		"its ops/s is over the whole window. " +
		fmt.Sprintf("think, mixed and shift-think are decrements whose fn waits %s between its read and its write (a stand-in for a call to another service), "+
			"each process on a pool of %d connections: think on spread keys, mixed with %d%% of its calls on one hot key and the rest on the others, "+
			"shift-think as shift; pessimistic-noqueue is the row lock with every waiter at the server, holding a connection, "+
			"where pessimistic queues a key's waiters in the process. procs is the processes running the cell at once. ", thinkTime, thinkPool, mixedHot) +
		fmt.Sprintf("retry-storm sends each request %d times, %d copies at once and the rest after them (a double click, then a client's retry); "+
			"its keys are its requests, fresh for each operation, and its ops/s counts requests; ×raw is over unique-insert's, the hand-written unique-index insert. ", stormCopies, stormAtOnce) +
		"retries/ok: re-runs of an optimistic strategy (and the adaptive guard) after a lost race, per success. The invariant is checked against the table after every cell: " +
		"decrement and shift — every sale shows in the stock, none below zero; claim — each job claimed by exactly one caller; " +
		"retry-storm — exactly one effect per request, and every copy of a request answered alike (check-then-insert, the control, breaks it).\n\n")
	b.WriteString(summary(rows))
	var files []string
	for _, wl := range o.Workloads {
		if !slices.ContainsFunc(rows, func(r row) bool { return r.Workload == wl }) {
			continue // shift, on a grid it has no cell in
		}
		fmt.Fprintf(&b, "## %s\n\n", wl)
		chart := wl + ".svg"
		for _, name := range []string{chart, wl + ".png"} {
			// The chart is of the run's own process count; the cells from
			// several processes are in the table.
			base := slices.DeleteFunc(slices.Clone(rows), func(r row) bool { return r.Processes != o.Processes })
			if err := writeChart(filepath.Join(o.Out, name), wl, base); err != nil {
				return nil, fmt.Errorf("chart %s: %w", name, err)
			}
			files = append(files, filepath.Join(o.Out, name))
		}
		fmt.Fprintf(&b, "![%s: throughput and p99 against workers](%s)\n\n", wl, chart)
		b.WriteString("| " + strings.Join(columns[1:], " | ") + " |\n|")
		for range columns[1:] {
			b.WriteString("---|")
		}
		b.WriteString("\n")
		for _, r := range rows {
			if r.Workload == wl {
				f := fields(rows, r)[1:]
				if r.failed() {
					f[len(f)-1] = "**" + f[len(f)-1] + "**"
				}
				b.WriteString("| " + strings.Join(f, " | ") + " |\n")
			}
		}
		b.WriteString("\n")
	}
	md := filepath.Join(o.Out, "results.md")
	if err := os.WriteFile(md, []byte(b.String()), 0o644); err != nil {
		return nil, err
	}
	return append([]string{md}, files...), nil
}

// writeChart draws, for one workload, throughput (top) and p99 (bottom)
// against workers, hot key (left) and spread keys (right), one line per
// strategy, both axes logarithmic.
func writeChart(path, wl string, rows []row) error {
	var keyCounts []int
	var strats []string
	for _, r := range rows {
		if r.Workload != wl {
			continue
		}
		if !slices.Contains(keyCounts, r.Keys) {
			keyCounts = append(keyCounts, r.Keys)
		}
		if !slices.Contains(strats, r.Strategy) {
			strats = append(strats, r.Strategy)
		}
	}
	slices.Sort(keyCounts)
	metrics := []struct {
		label string
		value func(row) float64
	}{
		{"ops/s", func(r row) float64 { return r.Throughput }},
		{"p99 latency (ms)", func(r row) float64 { return float64(r.P99) / float64(time.Millisecond) }},
	}
	legend := plot.NewLegend()
	legend.Top, legend.Left = true, true
	legend.Padding = vg.Millimeter
	legend.ThumbnailWidth = vg.Centimeter
	legend.TextStyle.Font.Size = vg.Points(13)
	plots := make([][]*plot.Plot, len(metrics))
	for m, metric := range metrics {
		plots[m] = make([]*plot.Plot, len(keyCounts))
		for k, keys := range keyCounts {
			p := plot.New()
			p.Title.Text = fmt.Sprintf("%s, %s: %s", wl, cell{Workload: wl, Keys: keys}.keyChoice(), metric.label)
			p.X.Label.Text = "workers"
			p.Y.Label.Text = metric.label
			p.X.Scale, p.Y.Scale = plot.LogScale{}, plot.LogScale{}
			p.Y.Tick.Marker = oneTwoFive{}
			var workerTicks []plot.Tick
			for _, s := range strats {
				// Dashes and marks by the strategy's place in the suite,
				// not in this chart, so that it looks the same in every
				// chart, as its colour does (shift runs only a few).
				i := max(slices.Index(allStrategies, s), 0)
				var xys plotter.XYs
				for _, r := range rows {
					if r.Workload == wl && r.Keys == keys && r.Strategy == s && r.Skipped == "" {
						if v := metric.value(r); v > 0 {
							xys = append(xys, plotter.XY{X: float64(r.Workers), Y: v})
							if !slices.ContainsFunc(workerTicks, func(t plot.Tick) bool { return t.Value == float64(r.Workers) }) {
								workerTicks = append(workerTicks, plot.Tick{Value: float64(r.Workers), Label: fmt.Sprint(r.Workers)})
							}
						}
					}
				}
				if len(xys) == 0 {
					continue
				}
				slices.SortFunc(xys, func(a, b plotter.XY) int { return cmp.Compare(a.X, b.X) })
				line, points, err := plotter.NewLinePoints(xys)
				if err != nil {
					return err
				}
				line.Color, line.Dashes = strategyColor(s), plotutil.Dashes(i)
				points.Color, points.Shape = strategyColor(s), plotutil.Shape(i)
				p.Add(line, points)
				// One legend per chart, beside the panels: every panel
				// has the same lines, and inside one it hides the data.
				if m == 0 && k == 0 {
					legend.Add(s, line, points)
				}
			}
			p.X.Tick.Marker = plot.ConstantTicks(workerTicks)
			p.Add(plotter.NewGrid())
			plots[m][k] = p
		}
	}
	const cellW, cellH, legendW = 7 * vg.Inch, 4.5 * vg.Inch, 2.1 * vg.Inch
	w, h := cellW*vg.Length(len(keyCounts))+legendW, cellH*vg.Length(len(metrics))
	var img interface {
		vg.CanvasSizer
		io.WriterTo
	}
	if filepath.Ext(path) == ".png" {
		img = vgimg.PngCanvas{Canvas: vgimg.New(w, h)}
	} else {
		img = vgsvg.New(w, h)
	}
	tiles := draw.Tiles{Rows: len(metrics), Cols: len(keyCounts), PadX: vg.Centimeter, PadY: vg.Centimeter,
		PadTop: vg.Millimeter * 5, PadBottom: vg.Millimeter * 5, PadLeft: vg.Millimeter * 5, PadRight: vg.Millimeter * 5}
	whole := draw.New(img)
	canvases := plot.Align(plots, tiles, draw.Crop(whole, 0, -legendW, 0, 0))
	for m := range plots {
		for k := range plots[m] {
			plots[m][k].Draw(canvases[m][k])
		}
	}
	legend.Draw(draw.Crop(whole, w-legendW+3*vg.Millimeter, 0, 0, -tiles.PadTop-vg.Centimeter))
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := img.WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// progress shows which cell runs and about how long the run has left.
type progress struct {
	w           io.Writer
	interactive bool
	total       int
	perCell     time.Duration // the estimate before any cell finished
	began       time.Time
}

func newProgress(w io.Writer, interactive bool, total int, d time.Duration) *progress {
	return &progress{w: w, interactive: interactive, total: total, perCell: d + 300*time.Millisecond, began: time.Now()}
}

func (p *progress) start(i int, c cell) {
	per := p.perCell
	if i > 0 {
		per = time.Since(p.began) / time.Duration(i)
	}
	left := (per * time.Duration(p.total-i)).Round(time.Second)
	line := fmt.Sprintf("[%d/%d] %s (about %s left)", i+1, p.total, c.name(), left)
	if p.interactive {
		fmt.Fprintf(p.w, "\r\033[K%s", line)
		return
	}
	fmt.Fprintln(p.w, line)
}

func (p *progress) finish(r row) {
	if r.failed() {
		if p.interactive {
			fmt.Fprintln(p.w)
		}
		fmt.Fprintf(p.w, "  %s: %s\n", r.name(), r.verdict())
	}
}

func (p *progress) done() {
	if p.interactive {
		fmt.Fprint(p.w, "\r\033[K")
	}
}

// strategyColor keeps each strategy's colour the same in every chart: the
// floor in black, the broken control in grey, and the others from
// Matplotlib's "tab10" palette, whose hues stay apart from each other (its
// pink is left out: beside red and purple it is the one pair that blurs).
func strategyColor(s string) color.Color {
	palette := map[string]color.RGBA{
		"raw":              {0, 0, 0, 255},
		"raw-pgx":          {0, 0, 128, 255},     // navy
		"atomic":           {31, 119, 180, 255},  // blue
		"atomic-pgx":       {199, 21, 133, 255},  // violet-red
		"pessimistic":      {255, 127, 14, 255},  // orange
		"optimistic":       {44, 160, 44, 255},   // green
		"optimistic-guard": {0, 90, 0, 255},      // dark green: the optimistic Store's sibling
		"adaptive":         {0, 128, 128, 255},   // teal
		"distlock":         {214, 39, 40, 255},   // red
		"poll":             {188, 189, 34, 255},  // olive
		"redislock":        {23, 190, 207, 255},  // cyan
		"redsync":          {140, 86, 75, 255},   // brown
		"queue":            {148, 103, 189, 255}, // purple
		"naive":            {127, 127, 127, 255}, // grey
		// The retry storm's: its floor in black, its control in grey.
		"unique-insert":     {0, 0, 0, 255},
		"idempotency":       {31, 119, 180, 255},  // blue
		"check-then-insert": {127, 127, 127, 255}, // grey
		// On MariaDB: the PostgreSQL namesake's hue, darker or lighter.
		"raw-mariadb":              {96, 96, 96, 255},    // dark grey
		"atomic-mariadb":           {120, 180, 230, 255}, // light blue
		"pessimistic-mariadb":      {170, 85, 0, 255},    // dark orange
		"optimistic-guard-mariadb": {130, 210, 130, 255}, // light green
		"adaptive-mariadb":         {80, 200, 200, 255},  // light teal
	}
	if c, ok := palette[s]; ok {
		return c
	}
	return color.RGBA{227, 119, 194, 255} // pink
}

// oneTwoFive labels a logarithmic axis at 1, 2 and 5 times each power of ten,
// so that a range narrower than a decade still gets labels.
type oneTwoFive struct{}

func (oneTwoFive) Ticks(lo, hi float64) []plot.Tick {
	var ticks []plot.Tick
	for p := math.Pow(10, math.Floor(math.Log10(lo))); p <= hi; p *= 10 {
		for _, f := range []float64{1, 2, 5} {
			v := p * f
			if v >= lo && v <= hi {
				ticks = append(ticks, plot.Tick{Value: v, Label: strconv.FormatFloat(v, 'g', -1, 64)})
			}
		}
	}
	if len(ticks) < 2 {
		return plot.LogTicks{Prec: 2}.Ticks(lo, hi)
	}
	return ticks
}

// summary is the report's opening: did every invariant hold, and how close
// the atomic strategy comes to the raw statement on the hot key.
func summary(rows []row) string {
	var b strings.Builder
	b.WriteString("## Summary\n\n")
	if failed := failures(rows); len(failed) > 0 {
		for _, r := range failed {
			fmt.Fprintf(&b, "- **%s: %s**\n", r.name(), r.verdict())
		}
	} else {
		b.WriteString("- Every strategy held its invariant in every cell")
		if slices.ContainsFunc(rows, func(r row) bool { return r.expectedBreak() && r.Violation != "" }) {
			b.WriteString(", except the controls (naive across processes, check-then-insert in the retry storm), which broke as they must")
		}
		b.WriteString(".\n")
	}
	for _, r := range rows {
		if strings.HasPrefix(r.Strategy, "atomic") && r.Keys == 1 && r.Skipped == "" {
			procs := ""
			if r.Processes > 1 {
				procs = fmt.Sprintf(" × %d processes", r.Processes)
			}
			fmt.Fprintf(&b, "- %s, hot key, %d worker(s)%s: %s at %s× %s.\n", r.Workload, r.Workers, procs, r.Strategy, vsRaw(rows, r), floor(r.Strategy))
		}
	}
	b.WriteString(lockSummary(rows))
	b.WriteString(adaptiveSummary(rows))
	b.WriteString(stormSummary(rows))
	b.WriteString("\n")
	return b.String()
}

// lockSummary says, for every hot-key cell that ran both, how distlock
// compares with the bare 1 ms polling loop, the floor the popular Redis
// locks reduce to: throughput as a multiple of the loop's, and p99 beside
// the loop's.
func lockSummary(rows []row) string {
	var b strings.Builder
	for _, r := range rows {
		if r.Strategy != "distlock" || r.Keys != 1 || r.Skipped != "" {
			continue
		}
		p, ok := sibling(rows, r, "poll")
		if !ok || p.Throughput <= 0 {
			continue
		}
		fmt.Fprintf(&b, "- %s, hot key, %d worker(s) × %d process(es): distlock at %.2f× the 1 ms polling loop, p99 %s against %s ms.\n",
			r.Workload, r.Workers, r.Processes, r.Throughput/p.Throughput, ms(r.P99), ms(p.P99))
	}
	return b.String()
}

// adaptiveSummary sets the adaptive guard, wherever it ran decrement or
// shift (the cells of its targets), beside the guards it chooses between: on
// the hot key beside the row lock (pessimistic), throughput and p99; on
// spread keys beside the optimistic guard; on the shift workload beside every
// strategy that ran it, by total throughput, and as a multiple of the better
// of the two fixed guards. adaptive-mariadb is set beside the guards on
// MariaDB in the same way.
func adaptiveSummary(rows []row) string {
	var b strings.Builder
	for _, r := range rows {
		if (r.Strategy != "adaptive" && r.Strategy != "adaptive-mariadb") || r.Skipped != "" {
			continue
		}
		server := strings.TrimPrefix(r.Strategy, "adaptive") // "" or "-mariadb"
		keys := r.keyChoice()
		if r.Keys == 1 {
			keys = "hot key"
		}
		where := fmt.Sprintf("- %s, %s, %d worker(s) × %d process(es)", r.Workload, keys, r.Workers, r.Processes)
		switch {
		case r.Workload == "shift" || r.Workload == "shift-think":
			b.WriteString(shiftSummary(rows, r, where))
		case r.Workload == "mixed":
			b.WriteString(mixedSummary(rows, r, where))
		case r.Workload != "decrement":
		case r.Keys == 1:
			if p, ok := sibling(rows, r, "pessimistic"+server); ok && p.Throughput > 0 {
				fmt.Fprintf(&b, "%s: %s at %.2f× %s, p99 %s against %s ms.\n",
					where, r.Strategy, r.Throughput/p.Throughput, p.Strategy, ms(r.P99), ms(p.P99))
			}
		default:
			if o, ok := sibling(rows, r, "optimistic-guard"+server); ok && o.Throughput > 0 {
				fmt.Fprintf(&b, "%s: %s at %.2f× %s, p99 %s against %s ms.\n",
					where, r.Strategy, r.Throughput/o.Throughput, o.Strategy, ms(r.P99), ms(o.P99))
			}
		}
	}
	return b.String()
}

// shiftSummary lists the total throughput of every strategy on adaptive's
// server in adaptive's shift cell, and says whether adaptive beat both fixed
// guards.
func shiftSummary(rows []row, adaptive row, where string) string {
	var totals []string
	var best row
	server := strings.TrimPrefix(adaptive.Strategy, "adaptive")
	strategies := shiftStrategies
	if thinks(adaptive.Workload) {
		strategies = thinkStrategies
	}
	for _, s := range strategies {
		o, ok := sibling(rows, adaptive, s)
		if !ok || onMariaDB(s) != onMariaDB(adaptive.Strategy) {
			continue
		}
		totals = append(totals, fmt.Sprintf("%s %.0f", s, o.Throughput))
		if (s == "pessimistic"+server || s == "optimistic-guard"+server) && o.Throughput > best.Throughput {
			best = o
		}
	}
	line := fmt.Sprintf("%s, total ops/s: %s", where, strings.Join(totals, ", "))
	if best.Throughput > 0 {
		verdict := "beats both fixed guards"
		if adaptive.Throughput <= best.Throughput {
			verdict = "does not beat both fixed guards"
		}
		line += fmt.Sprintf("; %s at %.2f× the better fixed guard (%s): it %s", adaptive.Strategy, adaptive.Throughput/best.Throughput, best.Strategy, verdict)
		line += oracleRatio(rows, adaptive, best)
	}
	return line + ".\n"
}

// oracleRatio sets oracle, the reference that knows the hot key, beside the
// better fixed guard best in adaptive's cell: what a choice per key could
// reach there. "" when oracle did not run (it runs on PostgreSQL only).
func oracleRatio(rows []row, adaptive, best row) string {
	o, ok := sibling(rows, adaptive, "oracle")
	if !ok || o.Throughput <= 0 || onMariaDB(adaptive.Strategy) {
		return ""
	}
	return fmt.Sprintf("; oracle (the reference) at %.2f× it", o.Throughput/best.Throughput)
}

// modeSummary says, for each cell of a workload with a hot key, the hot
// key's throughput and the other keys' p99 (mixed), and for adaptive's, in
// which mode its calls began: on the hot key, on the others, and how often
// the hot key changed mode.
func modeSummary(rows []row) string {
	var b strings.Builder
	for _, r := range rows {
		m := r.Modes
		if r.Skipped != "" || (r.HotThroughput == 0 && m.Hot == 0) {
			continue
		}
		fmt.Fprintf(&b, "- %s, %d worker(s) × %d process(es), %s: %.0f ops/s", r.Workload, r.Workers, r.Processes, r.Strategy, r.Throughput)
		if r.HotThroughput > 0 {
			fmt.Fprintf(&b, ", hot %.0f, cold p99 %s ms", r.HotThroughput, ms(r.ColdP99))
		}
		if m.Hot > 0 {
			fmt.Fprintf(&b, "; began %.1f%% of the hot key's %d calls locked (%d changes of mode; the first locked %s ms after the process's first call), %.2f%% of the other keys' %d",
				100*float64(m.HotLocked)/float64(m.Hot), m.Hot, m.Flips, ms(m.LockedAfter), 100*float64(m.ColdLocked)/float64(max(m.Cold, 1)), m.Cold)
		}
		b.WriteString("\n")
	}
	return b.String()
}

// mixedSummary lists, for adaptive's mixed cell, every think strategy's
// total throughput, the hot key's, and the cold keys' p99; it says how the
// row lock's queue changes the cold keys' p99, and how adaptive compares with
// the better fixed guard.
func mixedSummary(rows []row, adaptive row, where string) string {
	var each []string
	var best row
	server := strings.TrimPrefix(adaptive.Strategy, "adaptive")
	for _, s := range thinkStrategies {
		o, ok := sibling(rows, adaptive, s)
		if !ok || onMariaDB(s) != onMariaDB(adaptive.Strategy) {
			continue
		}
		each = append(each, fmt.Sprintf("%s %.0f (hot %.0f, cold p99 %s ms)", s, o.Throughput, o.HotThroughput, ms(o.ColdP99)))
		if (s == "pessimistic"+server || s == "optimistic-guard"+server) && o.Throughput > best.Throughput {
			best = o
		}
	}
	line := fmt.Sprintf("%s, total ops/s: %s", where, strings.Join(each, ", "))
	q, okq := sibling(rows, adaptive, "pessimistic"+server)
	n, okn := sibling(rows, adaptive, "pessimistic-noqueue"+server)
	if okq && okn && n.Throughput > 0 && n.ColdP99 > 0 {
		line += fmt.Sprintf("; the queue in the process: %.2f× the total, %.2f× the cold p99", q.Throughput/n.Throughput,
			float64(q.ColdP99)/float64(n.ColdP99))
	}
	if best.Throughput > 0 {
		line += fmt.Sprintf("; %s at %.2f× the better fixed guard (%s), cold p99 %s against %s ms", adaptive.Strategy,
			adaptive.Throughput/best.Throughput, best.Strategy, ms(adaptive.ColdP99), ms(best.ColdP99))
		line += oracleRatio(rows, adaptive, best)
	}
	return line + ".\n"
}

// stormSummary sets, in every retry storm cell, the store beside the
// hand-written unique insert, and says what the check-then-insert control
// did.
func stormSummary(rows []row) string {
	var b strings.Builder
	for _, r := range rows {
		if r.Workload != stormWorkload || r.Strategy != "idempotency" || r.Skipped != "" {
			continue
		}
		line := fmt.Sprintf("- %s, %d worker(s) × %d process(es): idempotency at %s× unique-insert",
			r.Workload, r.Workers, r.Processes, vsRaw(rows, r))
		if u, ok := sibling(rows, r, "unique-insert"); ok {
			line += fmt.Sprintf(", p99 %s against %s ms", ms(r.P99), ms(u.P99))
		}
		if c, ok := sibling(rows, r, "check-then-insert"); ok {
			verdict := "held this time"
			if c.Violation != "" {
				verdict = c.Violation
			}
			line += fmt.Sprintf("; check-then-insert (the control): %s", verdict)
		}
		b.WriteString(line + ".\n")
	}
	return b.String()
}
