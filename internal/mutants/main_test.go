package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Every mutant of the list still finds its original text, exactly once: a
// mutant whose code was rewritten fails here, in the ordinary test run,
// rather than only when someone runs the list.
func TestEveryMutantApplies(t *testing.T) {
	require.NoError(t, checkList(mutants))
	for _, m := range mutants {
		if _, err := os.Stat(filepath.Join("..", "..", filepath.FromSlash(m.Pkg))); err != nil {
			t.Errorf("mutant %s: its package: %v", m.Name, err)
		}
		src, err := os.ReadFile(filepath.Join("..", "..", filepath.FromSlash(m.File)))
		if err == nil {
			_, err = apply(m, src)
		}
		if err != nil {
			t.Errorf("mutant %s: %v", m.Name, err)
		}
	}
}

// The list covers every package whose promise a caller relies on.
func TestEveryPackageHasAMutant(t *testing.T) {
	covered := map[string]bool{}
	for _, m := range mutants {
		covered[m.Pkg] = true
	}
	for _, pkg := range []string{".", "./atomic", "./pessimistic", "./optimistic", "./adaptive", "./distlock",
		"./queue", "./queue/redisq", "./mysqldb", "./pgxdb", "./internal/keepalive"} {
		require.True(t, covered[pkg], "no mutant's tests are in %s", pkg)
	}
	var short int
	for _, m := range mutants {
		if m.Short {
			short++
		}
	}
	require.Positive(t, short, "no mutant for -short, which CI runs")
}

func TestApplyNeedsExactlyOne(t *testing.T) {
	m := mutant{File: "f.go", Old: "a == b", New: "a != b"}
	got, err := apply(m, []byte("x := a == b"))
	require.NoError(t, err)
	require.Equal(t, "x := a != b", string(got))
	_, err = apply(m, []byte("x := a >= b"))
	require.ErrorContains(t, err, "not there")
	_, err = apply(m, []byte("a == b; a == b"))
	require.ErrorContains(t, err, "2 times")
}

func TestCheckListRefusesDuplicates(t *testing.T) {
	m := mutant{Name: "a/b", File: "f", Old: "x", New: "y", Pkg: ".", Run: "T", Breaks: "p"}
	require.NoError(t, checkList([]mutant{m}))
	require.ErrorContains(t, checkList([]mutant{m, m}), "listed twice")
	bad := m
	bad.Run = "("
	require.Error(t, checkList([]mutant{bad}))
	bad = m
	bad.New = bad.Old
	require.Error(t, checkList([]mutant{bad}))
}

// A failure names the innermost failing test of the first that failed, and
// its first message; testify's message is found under its trace.
func TestJudgeCaught(t *testing.T) {
	out := strings.Join([]string{
		"--- FAIL: TestLockerIsAGuard (3.21s)",
		"    --- FAIL: TestLockerIsAGuard/wait (1.00s)",
		"        --- FAIL: TestLockerIsAGuard/wait/calls (1.00s)",
		"            --- FAIL: TestLockerIsAGuard/wait/calls/lost_race (1.00s)",
		"                guardtest.go:240: lost_race: the second caller never returned",
		"        --- FAIL: TestLockerIsAGuard/wait/other (1.00s)",
		"--- FAIL: TestSecond (0.10s)",
		"    stale_test.go:33: ",
		"        \tError Trace:\t/x/stale_test.go:33",
		"        \tError:      \tShould be false",
		"        \tMessages:   \tthe new holder's TTL moved",
		"FAIL",
	}, "\n")
	outcome, test, detail := judge(out, false, &exec.ExitError{}, false)
	require.Equal(t, caught, outcome)
	require.Equal(t, "TestLockerIsAGuard/wait/calls/lost_race", test)
	require.Equal(t, "guardtest.go:240: lost_race: the second caller never returned", detail)

	test, detail = firstFailure(out[strings.Index(out, "--- FAIL: TestSecond"):])
	require.Equal(t, "TestSecond", test)
	require.Equal(t, "stale_test.go:33: Should be false the new holder's TTL moved", detail)

	test, detail = firstFailure(strings.Join([]string{
		"--- FAIL: TestGuardLostRace (0.00s)",
		"    --- FAIL: TestGuardLostRace/attempts=1 (0.41s)",
		"        guard_test.go:194: ",
		"            \tError Trace:\tguard_test.go:194",
		"            \tError:      \tNot equal: ",
		"            \t            \texpected: account{Version:1}",
		"            \t            \tactual  : account{Version:0}",
		"            \t            \t",
		"            \t            \tDiff:",
		"            \tTest:       \tTestGuardLostRace/attempts=1",
	}, "\n"))
	require.Equal(t, "TestGuardLostRace/attempts=1", test)
	require.Equal(t, "guard_test.go:194: Not equal: expected: account{Version:1} actual : account{Version:0}", detail)
}

func TestJudgeHung(t *testing.T) {
	out := strings.Join([]string{
		"--- FAIL: TestFirst (0.10s)",
		"    a_test.go:1: broken",
		"panic: test timed out after 1m0s",
		"\trunning tests:",
		"\t\tTestCluster (1m0s)",
		"\t\tTestCluster/sell_across_processes (58s)",
		"",
		"goroutine 1 [running]:",
	}, "\n")
	outcome, test, detail := judge(out, false, &exec.ExitError{}, false)
	require.Equal(t, hung, outcome)
	require.Equal(t, "TestCluster/sell_across_processes", test)
	require.Contains(t, detail, "failed first: TestFirst: a_test.go:1: broken")

	outcome, _, _ = judge("", true, &exec.ExitError{}, false)
	require.Equal(t, hung, outcome, "killed by the watchdog")
}

func TestJudgeSurvivedAndOthers(t *testing.T) {
	outcome, _, _ := judge("ok\n", false, nil, false)
	require.Equal(t, survived, outcome)
	outcome, _, _ = judge("ok\n", false, nil, true)
	require.Equal(t, passed, outcome)
	outcome, _, _ = judge("testing: warning: no tests to run\nPASS\n", false, nil, false)
	require.Equal(t, noTests, outcome)
	outcome, test, detail := judge("PASS\ngoroutines left behind after the tests: found\n", false, &exec.ExitError{}, false)
	require.Equal(t, caught, outcome)
	require.Equal(t, "(no test failed)", test)
	require.Contains(t, detail, "goroutines left behind")
	outcome, _, _ = judge("", false, errors.New("exec: no such file"), false)
	require.Equal(t, noBuild, outcome)
}
