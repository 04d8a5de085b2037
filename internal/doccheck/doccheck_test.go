// Package doccheck checks that every exported identifier of the public
// packages has a doc comment, so that go doc and the Go package site show
// what each one is for.
package doccheck

import (
	"go/ast"
	"go/doc"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// publicDirs returns the directories of the repository's public packages:
// every directory with Go files except internal ones, the examples and
// testdata.
func publicDirs(t *testing.T, root string) []string {
	t.Helper()
	var dirs []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		rel, _ := filepath.Rel(root, path)
		base := d.Name()
		if rel != "." && (base == "internal" || base == "examples" || base == "testdata" || strings.HasPrefix(base, ".")) {
			return filepath.SkipDir
		}
		if m, _ := filepath.Glob(filepath.Join(path, "*.go")); len(m) > 0 {
			dirs = append(dirs, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return dirs
}

// An identifier is one exported name that go doc -all lists.
type identifier struct {
	name       string // pkg.Name, pkg.Type.Method, pkg.Type.Field
	documented bool
}

// identifiers lists the exported identifiers of the package in dir:
// constants, variables, functions, types, methods, and the exported fields
// and interface methods of exported types.
func identifiers(t *testing.T, dir string) []identifier {
	t.Helper()
	fset := token.NewFileSet()
	names, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	var files []*ast.File
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	if len(files) == 0 {
		return nil
	}
	d, err := doc.NewFromFiles(fset, files, dir)
	if err != nil {
		t.Fatal(err)
	}
	var ids []identifier
	values := func(vs []*doc.Value) {
		for _, v := range vs {
			for _, spec := range v.Decl.Specs {
				vspec := spec.(*ast.ValueSpec)
				for _, n := range vspec.Names {
					if n.IsExported() {
						// A name in a group is documented by its own
						// comment or the group's.
						ok := v.Doc != "" || vspec.Doc != nil || vspec.Comment != nil
						ids = append(ids, identifier{d.Name + "." + n.Name, ok})
					}
				}
			}
		}
	}
	funcs := func(prefix string, fs []*doc.Func) {
		for _, f := range fs {
			ids = append(ids, identifier{prefix + f.Name, f.Doc != ""})
		}
	}
	values(d.Consts)
	values(d.Vars)
	funcs(d.Name+".", d.Funcs)
	for _, ty := range d.Types {
		ids = append(ids, identifier{d.Name + "." + ty.Name, ty.Doc != ""})
		values(ty.Consts)
		values(ty.Vars)
		funcs(d.Name+".", ty.Funcs)
		funcs(d.Name+"."+ty.Name+".", ty.Methods)
		for _, spec := range ty.Decl.Specs {
			ts := spec.(*ast.TypeSpec)
			var fields *ast.FieldList
			switch u := ts.Type.(type) {
			case *ast.StructType:
				fields = u.Fields
			case *ast.InterfaceType:
				fields = u.Methods
			}
			if fields == nil {
				continue
			}
			for _, f := range fields.List {
				for _, n := range f.Names {
					if n.IsExported() {
						ids = append(ids, identifier{d.Name + "." + ty.Name + "." + n.Name, f.Doc != nil || f.Comment != nil})
					}
				}
			}
		}
	}
	return ids
}

// Every exported identifier of a public package has a doc comment.
func TestEveryExportedIdentifierIsDocumented(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatal(err)
	}
	total := 0
	var missing []string
	for _, dir := range publicDirs(t, root) {
		for _, id := range identifiers(t, dir) {
			total++
			if os.Getenv("DOCCHECK_LIST") != "" {
				rel, _ := filepath.Rel(root, dir)
				t.Logf("%s: %s", rel, id.name)
			}
			if !id.documented {
				rel, _ := filepath.Rel(root, dir)
				missing = append(missing, rel+": "+id.name)
			}
		}
	}
	slices.Sort(missing)
	t.Logf("%d exported identifiers, %d without a doc comment", total, len(missing))
	if len(missing) > 0 {
		t.Errorf("exported identifiers without a doc comment:\n%s", strings.Join(missing, "\n"))
	}
}
