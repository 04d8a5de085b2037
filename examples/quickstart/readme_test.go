package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/contend/contend/internal/testserver"
)

// The README's first program and its snippets, one per strategy, build in
// a module of their own outside the repository, which sees only the public
// API and resolves contend and otelcontend as a user's module does (no
// workspace; a replace to this checkout in that module's go.mod only), and
// run against real servers: the first program sells exactly the stock,
// every snippet returns nil, and the debits they make leave the balance
// they should.
func TestREADMEProgramAndSnippets(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a module")
	}
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	program := goBlocks(t, string(readme), "## A first program", "## Which guard")
	require.Len(t, program, 1, "the first program is one block")
	snippets := goBlocks(t, string(readme), "## One snippet per strategy", "## More")
	code := strings.Join(snippets, "\n")

	// Every strategy has a snippet.
	for _, pkg := range []string{"atomic", "pessimistic", "optimistic", "adaptive", "distlock", "queue", "redisq", "otelcontend"} {
		require.Contains(t, code, pkg+".", "the README has no snippet using %s", pkg)
	}
	calls := snippetFuncs(code)
	require.NotEmpty(t, calls)

	root, err := filepath.Abs("../..")
	require.NoError(t, err)
	dir := t.TempDir()
	write := func(name, content string) {
		require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644))
	}
	write("main.go", program[0])
	write("snippets/snippets.go", "package main\n\n"+imports(code)+"\n"+code)
	write("snippets/main.go", snippetsMain(calls))
	write("go.mod", "module readme\n\ngo 1.25.0\n\n"+
		"require (\n\tgithub.com/contend/contend v0.0.0\n\tgithub.com/contend/contend/otelcontend v0.0.0\n)\n\n"+
		"replace (\n\tgithub.com/contend/contend => "+root+"\n\tgithub.com/contend/contend/otelcontend => "+filepath.Join(root, "otelcontend")+"\n)\n")
	var sum []byte
	for _, f := range []string{"go.sum", "otelcontend/go.sum"} {
		b, err := os.ReadFile(filepath.Join(root, f))
		require.NoError(t, err)
		sum = append(sum, b...)
	}
	write("go.sum", string(sum))

	redis := testserver.OwnRedis(t) // the snippets use the default key prefixes
	env := append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod",
		"CONTEND_POSTGRES_URL="+testserver.Postgres(t), "CONTEND_REDIS_URL="+redis.URL())
	run := func(args ...string) string {
		cmd := exec.Command("go", args...)
		cmd.Dir, cmd.Env = dir, env
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "go %v: %s", args, out)
		return string(out)
	}
	run("mod", "tidy")
	requireNoWorkspaceModule(t, run("list", "-m", "all"))
	run("build", "-o", "bin/", "./...")
	require.Equal(t, "sold 3\n", run("run", "."))

	want := ""
	for _, c := range calls {
		want += c.name + ": <nil>\n"
	}
	// Each of the three debits takes 10 from 100.
	want += "balance: 70\n"
	require.Equal(t, want, run("run", "./snippets"))
}

// goBlocks returns the ```go blocks of text between the headings from and
// to.
func goBlocks(t *testing.T, text, from, to string) []string {
	t.Helper()
	_, after, ok := strings.Cut(text, from)
	require.True(t, ok, "README has no %q", from)
	section, _, ok := strings.Cut(after, to)
	require.True(t, ok, "README has no %q after %q", to, from)
	var blocks []string
	for {
		_, rest, ok := strings.Cut(section, "```go\n")
		if !ok {
			return blocks
		}
		block, rest, ok := strings.Cut(rest, "```")
		require.True(t, ok, "unterminated block")
		blocks = append(blocks, block)
		section = rest
	}
}

type snippetCall struct{ name, handle string }

// snippetFuncs finds the snippets' entry points: the functions that take
// ctx and a database pool or a Redis client and return an error.
func snippetFuncs(code string) []snippetCall {
	re := regexp.MustCompile(`(?m)^func (\w+)\(ctx context\.Context, (db \*sql\.DB|rdb \*redis\.Client)\) error`)
	var calls []snippetCall
	for _, m := range re.FindAllStringSubmatch(code, -1) {
		calls = append(calls, snippetCall{name: m[1], handle: strings.Fields(m[2])[0]})
	}
	return calls
}

// imports writes the import block the snippets need, as an editor would:
// the README leaves imports out.
func imports(code string) string {
	known := map[string]string{
		"context":     "context",
		"sql":         "database/sql",
		"errors":      "errors",
		"fmt":         "fmt",
		"time":        "time",
		"redis":       "github.com/redis/go-redis/v9",
		"contend":     "github.com/contend/contend",
		"atomic":      "github.com/contend/contend/atomic",
		"pessimistic": "github.com/contend/contend/pessimistic",
		"optimistic":  "github.com/contend/contend/optimistic",
		"adaptive":    "github.com/contend/contend/adaptive",
		"distlock":    "github.com/contend/contend/distlock",
		"queue":       "github.com/contend/contend/queue",
		"redisq":      "github.com/contend/contend/queue/redisq",
		"otelcontend": "github.com/contend/contend/otelcontend",
	}
	var paths []string
	for _, m := range regexp.MustCompile(`\b([a-z]+)\.[A-Z]`).FindAllStringSubmatch(code, -1) {
		if p, ok := known[m[1]]; ok && !slices.Contains(paths, p) {
			paths = append(paths, p)
		}
	}
	slices.Sort(paths)
	return "import (\n\t\"" + strings.Join(paths, "\"\n\t\"") + "\"\n)\n"
}

// snippetsMain is a program that makes the snippets' tables, calls every
// snippet, and prints what each returned and the balance left.
func snippetsMain(calls []snippetCall) string {
	var b strings.Builder
	b.WriteString(`package main

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"os"

	_ "github.com/lib/pq"
	"github.com/redis/go-redis/v9"
)

func main() {
	ctx := context.Background()
	db, err := sql.Open("postgres", os.Getenv("CONTEND_POSTGRES_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(10)
	if _, err := db.ExecContext(ctx, ` + "`" + `
		CREATE TABLE bots (id text PRIMARY KEY, engine_id text);
		INSERT INTO bots VALUES ('bot-1', NULL);
		CREATE TABLE accounts (id text PRIMARY KEY, balance int NOT NULL, version bigint NOT NULL DEFAULT 0);
		INSERT INTO accounts (id, balance) VALUES ('acc-1', 100)` + "`" + `); err != nil {
		log.Fatal(err)
	}
	opts, err := redis.ParseURL(os.Getenv("CONTEND_REDIS_URL"))
	if err != nil {
		log.Fatal(err)
	}
	rdb := redis.NewClient(opts)
	defer rdb.Close()
`)
	for _, c := range calls {
		fmt.Fprintf(&b, "\tfmt.Printf(\"%%s: %%v\\n\", %q, %s(ctx, %s))\n", c.name, c.name, c.handle)
	}
	b.WriteString(`	var balance int
	if err := db.QueryRowContext(ctx, "SELECT balance FROM accounts WHERE id = 'acc-1'").Scan(&balance); err != nil {
		log.Fatal(err)
	}
	fmt.Println("balance:", balance)
}
`)
	return b.String()
}

// requireNoWorkspaceModule checks that the module was built as a user's:
// contend and otelcontend replaced by directories, nothing else of this
// repository in the build list.
func requireNoWorkspaceModule(t *testing.T, list string) {
	t.Helper()
	for _, line := range strings.Split(strings.TrimSpace(list), "\n") {
		if strings.HasPrefix(line, "github.com/contend/contend") {
			require.Contains(t, line, "=>", "%s: a module of this repository not replaced by the checkout", line)
		}
	}
	require.NotContains(t, list, "github.com/contend/contend/examples")
}
