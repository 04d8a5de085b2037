// Package sqlident validates and quotes the table and column names that come
// from configuration. Names never come from keys or values: those are always
// bind parameters.
package sqlident

import (
	"fmt"
	"strings"

	"github.com/contend/contend"
	"github.com/contend/contend/internal/sqldb"
)

// maxLen is PostgreSQL's NAMEDATALEN-1: longer names are silently truncated
// by the server, so two different configured names could meet. MySQL's
// limit is 64, so one bound serves both.
const maxLen = 63

// Quote validates name as a plain identifier, or schema.name, and returns it
// quoted for PostgreSQL. A plain identifier is a letter or underscore followed
// by letters, digits and underscores; anything else (spaces, quotes,
// semicolons) is refused rather than escaped, because such a name in
// configuration is far more likely an injection or a typo than a real table.
func Quote(what, name string) (string, error) {
	return QuoteIn(sqldb.Postgres, what, name)
}

// QuoteIn is [Quote] for the server of dialect: double quotes for
// PostgreSQL, backquotes for MySQL (database.name there). The names it
// admits are the same in both.
func QuoteIn(dialect sqldb.Dialect, what, name string) (string, error) {
	q := `"`
	if dialect == sqldb.MySQL {
		q = "`"
	}
	parts := strings.Split(name, ".")
	if len(parts) > 2 {
		return "", fmt.Errorf("%s %q: at most one dot (schema.name) allowed: %w", what, name, contend.ErrInvalid)
	}
	for i, p := range parts {
		if err := check(p); err != nil {
			return "", fmt.Errorf("%s %q: %s: %w", what, name, err, contend.ErrInvalid)
		}
		// check admits no quote of either kind to escape, and no NUL.
		parts[i] = q + p + q
	}
	return strings.Join(parts, "."), nil
}

func check(s string) error {
	if s == "" {
		return fmt.Errorf("empty name")
	}
	if len(s) > maxLen {
		return fmt.Errorf("longer than %d bytes", maxLen)
	}
	for i, r := range s {
		switch {
		case r == '_', 'a' <= r && r <= 'z', 'A' <= r && r <= 'Z':
		case '0' <= r && r <= '9' && i > 0:
		default:
			return fmt.Errorf("%q at byte %d is not a letter, digit or underscore", r, i)
		}
	}
	return nil
}

// TextArray returns values as a PostgreSQL array literal ({"a","b"}), to
// be sent as one text parameter that the server reads as an array of the
// type the statement needs (= ANY($1)). Every element is quoted, with
// backslash and double quote escaped, so no value can end the element or
// the array early; an array literal cannot hold a NUL, and neither can
// PostgreSQL's text. It replaces pq.Array, so that no library package links
// lib/pq, and works alike on every driver: pgx sends a string parameter in
// text format whatever the parameter's type.
func TextArray(values []string) string {
	var b strings.Builder
	b.WriteByte('{')
	for i, v := range values {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('"')
		for i := 0; i < len(v); i++ { // bytes, not runes: invalid UTF-8 passes as is
			if v[i] == '"' || v[i] == '\\' {
				b.WriteByte('\\')
			}
			b.WriteByte(v[i])
		}
		b.WriteByte('"')
	}
	b.WriteByte('}')
	return b.String()
}
