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
package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
)

// line matches "BenchmarkX/a/b-2   1234   5678 ns/op ...".
var line = regexp.MustCompile(`^(Benchmark\S+?)(?:-\d+)?\s+\d+\s+([0-9.]+) ns/op`)

func main() {
	samples, order, err := read(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchratio:", err)
		os.Exit(1)
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "benchmark\traw ns/op\tns/op\tratio\tpaired\tn\t")
	paired := 0
	for _, name := range order {
		for _, floor := range floors(name, samples) {
			r, c := median(samples[floor]), median(samples[name])
			fmt.Fprintf(w, "%s\t%.0f\t%.0f\t%.3f\t%.3f\t%d\t\n", name, r, c, c/r, pairedRatio(samples[floor], samples[name]), min(len(samples[floor]), len(samples[name])))
			paired++
		}
	}
	w.Flush()
	if paired == 0 {
		fmt.Fprintln(os.Stderr, "benchratio: no raw/library pairs in the input")
		os.Exit(1)
	}
}

// floors returns the raw sibling of name: the benchmark whose name differs
// from it in one path segment, which is "raw" there.
func floors(name string, samples map[string][]float64) []string {
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

func read(r io.Reader) (map[string][]float64, []string, error) {
	samples := map[string][]float64{}
	var order []string
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		m := line.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		v, err := strconv.ParseFloat(m[2], 64)
		if err != nil {
			return nil, nil, err
		}
		if _, ok := samples[m[1]]; !ok {
			order = append(order, m[1])
		}
		samples[m[1]] = append(samples[m[1]], v)
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
