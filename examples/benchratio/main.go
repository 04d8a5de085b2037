// Command benchratio pairs each library benchmark with its raw floor and
// prints the overhead as a ratio of medians.
//
// Benchmarks name the floor `raw` in the path segment where the library's run
// names itself (BenchmarkUpdate/raw/hot beside BenchmarkUpdate/contend/hot, or
// BenchmarkGuard/raw/spread beside BenchmarkGuard/pessimistic/spread).
// The ratio is of the two medians; paired is the median of the ratios of
// the i-th run of each, which cancels the machine's drift between runs when
// the benchmark measures the two back to back, as distlock's does. Run the
// benchmarks with -count ≥ 5 so the medians mean something:
//
//	go test -run '^$' -bench . -count 6 ./atomic/ | go run ./examples/benchratio
//
// Both ratios are of time per op, library over raw (below 1 the library is
// faster); throughput is the inverse, raw's time over the library's. Run
// with -benchmem, the table also gives both sides' allocs/op and how many
// more the library makes. Where go test names the package ("pkg:" lines),
// names begin with its last element, so that two packages' benchmarks of
// one name are told apart. A
// second table pairs the metrics a benchmark reports with b.ReportMetric
// (distlock's p99-ns, max/min, cpu-ns/op and redis-cpu-ns/op) the same way,
// where raw reports them too.
package main

import (
	"bufio"
	"fmt"
	"io"
	"maps"
	"os"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
)

// line matches "BenchmarkX/a/b-2   1234   5678 ns/op ..." and gives the
// name and what follows the iteration count: value and unit pairs.
var line = regexp.MustCompile(`^(Benchmark\S+?)(?:-\d+)?\s+\d+\s+(.*)$`)

// Runs are the samples of one benchmark: each unit's value, run by run.
type runs map[string][]float64

func main() {
	samples, order, err := read(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchratio:", err)
		os.Exit(1)
	}
	if write(os.Stdout, samples, order) == 0 {
		fmt.Fprintln(os.Stderr, "benchratio: no raw/library pairs in the input")
		os.Exit(1)
	}
}

// write prints the ns/op table and, if any benchmark pair reports other
// metrics, the table of those; it returns how many pairs it printed.
func write(out io.Writer, samples map[string]runs, order []string) int {
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "benchmark\traw ns/op\tns/op\tratio\tpaired\tthroughput ×raw\tn\traw allocs\tallocs\t+allocs\t")
	type pair struct{ floor, name string }
	var pairs []pair
	for _, name := range order {
		for _, floor := range floors(name, samples) {
			r, l := samples[floor]["ns/op"], samples[name]["ns/op"]
			if len(r) == 0 || len(l) == 0 {
				continue
			}
			fmt.Fprintf(w, "%s\t%.0f\t%.0f\t%.3f\t%.3f\t%.2f\t%d\t%s\n", name, median(r), median(l),
				median(l)/median(r), pairedRatio(r, l), median(r)/median(l), min(len(r), len(l)),
				allocs(samples[floor]["allocs/op"], samples[name]["allocs/op"]))
			pairs = append(pairs, pair{floor, name})
		}
	}
	w.Flush()
	header := false
	for _, p := range pairs {
		for _, unit := range slices.Sorted(maps.Keys(samples[p.name])) {
			r, l := samples[p.floor][unit], samples[p.name][unit]
			if unit == "ns/op" || unit == "allocs/op" || unit == "B/op" || len(r) == 0 {
				continue
			}
			if !header {
				fmt.Fprintln(out)
				fmt.Fprintln(w, "benchmark\tmetric\traw\tlibrary\tratio\tpaired\tn\t")
				header = true
			}
			fmt.Fprintf(w, "%s\t%s\t%.4g\t%.4g\t%.3f\t%.3f\t%d\t\n", p.name, unit, median(r), median(l),
				median(l)/median(r), pairedRatio(r, l), min(len(r), len(l)))
		}
	}
	w.Flush()
	return len(pairs)
}

// allocs gives the allocation columns of a pair run with -benchmem: raw's
// and the library's median allocs/op, and how many more the library makes
// (a difference, not a ratio: the budget is counted in objects per op).
func allocs(raw, lib []float64) string {
	if len(raw) == 0 || len(lib) == 0 {
		return "\t\t\t"
	}
	r, l := median(raw), median(lib)
	return fmt.Sprintf("%.0f\t%.0f\t%+.0f\t", r, l, l-r)
}

// floors returns the raw sibling of name: the benchmark whose name differs
// from it in one path segment, which is "raw" there.
func floors(name string, samples map[string]runs) []string {
	segs := strings.Split(name, "/")
	var out []string
	for i := 1; i < len(segs); i++ {
		if segs[i] == "raw" {
			continue
		}
		sib := slices.Clone(segs)
		sib[i] = "raw"
		if f := strings.Join(sib, "/"); samples[f] != nil {
			out = append(out, f)
		}
	}
	return out
}

func read(r io.Reader) (map[string]runs, []string, error) {
	samples := map[string]runs{}
	var order []string
	pkg := "" // the package of the lines that follow, as "atomic."
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		if p, ok := strings.CutPrefix(sc.Text(), "pkg: "); ok {
			pkg = path.Base(strings.TrimSpace(p)) + "."
			continue
		}
		m := line.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		m[1] = pkg + m[1]
		fields := strings.Fields(m[2])
		if len(fields)%2 != 0 {
			return nil, nil, fmt.Errorf("%s: values and units do not pair up: %q", m[1], m[2])
		}
		if _, ok := samples[m[1]]; !ok {
			order = append(order, m[1])
			samples[m[1]] = runs{}
		}
		for i := 0; i < len(fields); i += 2 {
			v, err := strconv.ParseFloat(fields[i], 64)
			if err != nil {
				return nil, nil, fmt.Errorf("%s: %w", m[1], err)
			}
			samples[m[1]][fields[i+1]] = append(samples[m[1]][fields[i+1]], v)
		}
	}
	return samples, order, sc.Err()
}

// pairedRatio is the median of lib[i]/raw[i] over the runs both have.
func pairedRatio(raw, lib []float64) float64 {
	n := min(len(raw), len(lib))
	ratios := make([]float64, n)
	for i := range n {
		ratios[i] = lib[i] / raw[i]
	}
	return median(ratios)
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
