package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/contend/contend/internal/testserver"
)

// The README's first program compiles in a module of its own, which sees
// only the public API, and sells exactly the stock.
func TestREADMEProgram(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a module")
	}
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	_, after, ok := strings.Cut(string(readme), "## A first program")
	require.True(t, ok, "README has no first program")
	_, after, ok = strings.Cut(after, "```go\n")
	require.True(t, ok)
	program, _, ok := strings.Cut(after, "```")
	require.True(t, ok)

	root, err := filepath.Abs("../..")
	require.NoError(t, err)
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "main.go"), []byte(program), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module readme\n\ngo 1.25\n\n"+
		"require github.com/contend/contend v0.0.0\n\nreplace github.com/contend/contend => "+root+"\n"), 0o644))
	sum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "go.sum"), sum, 0o644))

	env := append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod", "CONTEND_POSTGRES_URL="+testserver.Postgres(t))
	run := func(args ...string) string {
		cmd := exec.Command("go", args...)
		cmd.Dir, cmd.Env = dir, env
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "go %v: %s", args, out)
		return string(out)
	}
	run("mod", "tidy")
	require.Equal(t, "sold 3\n", run("run", "."))
}
