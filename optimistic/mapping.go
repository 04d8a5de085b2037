package optimistic

import (
	"database/sql"
	"database/sql/driver"
	"fmt"
	"reflect"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/jmoiron/sqlx/reflectx"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/sqldb"
	"github.com/contend/contend/internal/sqlident"
)

// A column is one struct field that maps to a table column.
type column struct {
	name   string // as mapped from the struct tag
	quoted string
	index  []int // the field's traversal, for reflectx.FieldByIndexes
}

// A mapping is T's columns, worked out once at construction so that calls
// only walk precomputed field indexes: no tag parsing and no name lookups per
// call.
type mapping struct {
	cols    []column
	key     int // index into cols
	version int // index into cols
	// set lists the columns an update writes: every column but the key and
	// the version, which the statement handles itself.
	set []int
}

var (
	scannerType = reflect.TypeFor[sql.Scanner]()
	valuerType  = reflect.TypeFor[driver.Valuer]()
	timeType    = reflect.TypeFor[time.Time]()
)

// mapperFor returns the mapper sqlx uses for db: its own when db is an sqlx
// handle (so a customised db.Mapper is honoured), else sqlx's default, `db`
// tags with lower-cased field names as the fallback.
func mapperFor(db contend.DB) *reflectx.Mapper {
	switch d := db.(type) {
	case *sqlx.DB:
		if d.Mapper != nil {
			return d.Mapper
		}
	case *sqlx.Tx:
		if d.Mapper != nil {
			return d.Mapper
		}
	}
	return reflectx.NewMapperFunc("db", sqlx.NameMapper)
}

// newMapping maps the struct type t with m, the way sqlx would scan it, and
// finds the key and version columns among its fields; names are quoted for
// the server of d.
func newMapping(t reflect.Type, m *reflectx.Mapper, d sqldb.Dialect, keyCol, versionCol string) (*mapping, error) {
	if t.Kind() != reflect.Struct {
		return nil, fmt.Errorf("optimistic: %v is not a struct: %w", t, contend.ErrInvalid)
	}
	sm := m.TypeMap(t)
	mp := &mapping{key: -1, version: -1}
	for _, fi := range sm.Index {
		// Embedded structs contribute their fields, not a column of their
		// own; fields of nested structs have dotted paths, which name no
		// column of a plain table; a shadowed field loses to the one sqlx
		// would scan into.
		if fi.Embedded || strings.Contains(fi.Path, ".") || sm.Names[fi.Path] != fi {
			continue
		}
		if err := checkFieldType(t, fi); err != nil {
			return nil, err
		}
		quoted, err := sqlident.QuoteIn(d, fmt.Sprintf("optimistic: %v.%s: column", t, fi.Field.Name), fi.Path)
		if err != nil {
			return nil, err
		}
		switch fi.Path {
		case keyCol:
			mp.key = len(mp.cols)
		case versionCol:
			if !isInteger(fi.Field.Type.Kind()) {
				return nil, fmt.Errorf("optimistic: %v.%s: version column %q must be an integer field, not %v: %w",
					t, fi.Field.Name, versionCol, fi.Field.Type, contend.ErrInvalid)
			}
			mp.version = len(mp.cols)
		default:
			mp.set = append(mp.set, len(mp.cols))
		}
		mp.cols = append(mp.cols, column{name: fi.Path, quoted: quoted, index: fi.Index})
	}
	if mp.key < 0 {
		return nil, fmt.Errorf("optimistic: %v has no field for key column %q (tag one `db:%q`): %w", t, keyCol, keyCol, contend.ErrInvalid)
	}
	if mp.version < 0 {
		return nil, fmt.Errorf("optimistic: %v has no field for version column %q (tag one `db:%q`): %w", t, versionCol, versionCol, contend.ErrInvalid)
	}
	return mp, nil
}

// checkFieldType refuses a struct-typed field that no driver can take as a
// value: its own fields would be skipped as dotted paths, and the struct
// itself would fail at the first write instead of at construction.
func checkFieldType(t reflect.Type, fi *reflectx.FieldInfo) error {
	ft := fi.Field.Type
	if ft.Kind() == reflect.Pointer {
		ft = ft.Elem()
	}
	if ft.Kind() != reflect.Struct || ft == timeType ||
		reflect.PointerTo(ft).Implements(scannerType) || ft.Implements(valuerType) || reflect.PointerTo(ft).Implements(valuerType) {
		return nil
	}
	return fmt.Errorf("optimistic: %v.%s (column %q) is a struct that is neither a sql.Scanner nor a driver.Valuer; tag it `db:\"-\"` or give it those methods: %w",
		t, fi.Field.Name, fi.Path, contend.ErrInvalid)
}

func isInteger(k reflect.Kind) bool {
	switch k {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return true
	}
	return false
}

func (m *mapping) field(v reflect.Value, col int) reflect.Value {
	return reflectx.FieldByIndexes(v, m.cols[col].index)
}

// dests returns pointers to v's fields in column order, for Scan.
func (m *mapping) dests(v reflect.Value) []any {
	return m.appendDests(make([]any, 0, len(m.cols)), v)
}

// appendDests appends [mapping.dests] to d.
func (m *mapping) appendDests(d []any, v reflect.Value) []any {
	for i := range m.cols {
		d = append(d, m.field(v, i).Addr().Interface())
	}
	return d
}

// attemptArgs returns an empty slice with room for all that one attempt of
// [Store.Update] hands the driver, one after the other: the read's key, its
// destinations ([mapping.dests]) and the update's arguments
// ([mapping.updateArgs]).
func (m *mapping) attemptArgs() []any {
	return make([]any, 0, 1+len(m.cols)+len(m.set)+2)
}

func (m *mapping) keyOf(v reflect.Value) any { return m.field(v, m.key).Interface() }

func (m *mapping) versionOf(v reflect.Value) int64 {
	f := m.field(v, m.version)
	if f.CanInt() {
		return f.Int()
	}
	return int64(f.Uint())
}

func (m *mapping) setVersion(v reflect.Value, n int64) {
	f := m.field(v, m.version)
	if f.CanInt() {
		f.SetInt(n)
		return
	}
	f.SetUint(uint64(n))
}

// updateArgs returns the values of the set columns, then key and version:
// the parameters of a Store's update statement, in the order they appear
// in it.
func (m *mapping) updateArgs(v reflect.Value, key any, version int64) []any {
	return m.appendUpdateArgs(make([]any, 0, len(m.set)+2), v, key, version)
}

// appendUpdateArgs appends [mapping.updateArgs] to args.
func (m *mapping) appendUpdateArgs(args []any, v reflect.Value, key any, version int64) []any {
	for _, c := range m.set {
		args = append(args, m.field(v, c).Interface())
	}
	return append(args, key, version)
}

// values returns every column's value, in column order.
func (m *mapping) values(v reflect.Value) []any {
	args := make([]any, len(m.cols))
	for i := range m.cols {
		args[i] = m.field(v, i).Interface()
	}
	return args
}
